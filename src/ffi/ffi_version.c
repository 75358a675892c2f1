/*
 * ffi_version.c — the XLA FFI API version the handlers declare, and the proof that they may.
 *
 * XLA accepts a handler whose declared API version has the framework's major and a minor from 1 up to
 * the framework's own (measured with one library declaring 0.0 .. 0.6 on jaxlib 0.7.0, 0.8.0,
 * 0.9.0, 0.10.2, 0.11.2 and 0.12.0.1, which implement FFI API 0.1, 0.1, 0.2, 0.3, 0.4 and 0.5: each took
 * 0.1 .. its own minor and refused 0.0 and anything newer). So the handlers declare 0.1, the oldest
 * version holding everything they use, and one build runs on every jaxlib from 0.7 on, whichever header
 * it was compiled against.
 *
 * That holds only while the header's structs keep the 0.1 layout for the fields read or written here and
 * in ffi_util.c / ffi_attn.c / ffi_decode.c. The assertions below pin every one of them (LP64 offsets,
 * enum values, the slots of the two API functions called), so a header that moves one fails the build
 * instead of a user's run. Headers 0.1 .. 0.5 differ only in names the handlers never spell (the
 * extension type, XLA_FFI_Error_GetMessage / GetDetails, ExecutionContext / InvokeContext) and in fields
 * appended after the ones used.
 */
#include <stddef.h>

#include "sa_ffi.h"

#if XLA_FFI_API_MAJOR != SA_FFI_API_MAJOR || XLA_FFI_API_MINOR < SA_FFI_API_MINOR
#error "the jaxlib FFI header is older than FFI API 0.1 or of another major version: use jaxlib >= 0.7"
#endif

#define SA_FFI_AT(type, field, off) _Static_assert(offsetof(type, field) == (off), #type "." #field " moved")

_Static_assert(sizeof(void *) == 8 && sizeof(size_t) == 8, "the layout below is the LP64 one");
SA_FFI_AT(XLA_FFI_CallFrame, extension_start, 8);
SA_FFI_AT(XLA_FFI_CallFrame, api, 16);
SA_FFI_AT(XLA_FFI_CallFrame, ctx, 24);
SA_FFI_AT(XLA_FFI_CallFrame, stage, 32);
SA_FFI_AT(XLA_FFI_CallFrame, args, 40);
SA_FFI_AT(XLA_FFI_CallFrame, rets, 80);
SA_FFI_AT(XLA_FFI_CallFrame, attrs, 120);
SA_FFI_AT(XLA_FFI_Args, size, 16);
SA_FFI_AT(XLA_FFI_Args, types, 24);
SA_FFI_AT(XLA_FFI_Args, args, 32);
SA_FFI_AT(XLA_FFI_Rets, size, 16);
SA_FFI_AT(XLA_FFI_Rets, types, 24);
SA_FFI_AT(XLA_FFI_Rets, rets, 32);
SA_FFI_AT(XLA_FFI_Attrs, size, 16);
SA_FFI_AT(XLA_FFI_Attrs, types, 24);
SA_FFI_AT(XLA_FFI_Attrs, names, 32);
SA_FFI_AT(XLA_FFI_Attrs, attrs, 40);
SA_FFI_AT(XLA_FFI_Buffer, dtype, 16);
SA_FFI_AT(XLA_FFI_Buffer, data, 24);
SA_FFI_AT(XLA_FFI_Buffer, rank, 32);
SA_FFI_AT(XLA_FFI_Buffer, dims, 40);
SA_FFI_AT(XLA_FFI_Scalar, dtype, 0);
SA_FFI_AT(XLA_FFI_Scalar, value, 8);
SA_FFI_AT(XLA_FFI_ByteSpan, ptr, 0);
SA_FFI_AT(XLA_FFI_ByteSpan, len, 8);
SA_FFI_AT(XLA_FFI_Error_Create_Args, extension_start, 8);
SA_FFI_AT(XLA_FFI_Error_Create_Args, message, 16);
SA_FFI_AT(XLA_FFI_Error_Create_Args, errc, 24);
SA_FFI_AT(XLA_FFI_Stream_Get_Args, extension_start, 8);
SA_FFI_AT(XLA_FFI_Stream_Get_Args, ctx, 16);
SA_FFI_AT(XLA_FFI_Stream_Get_Args, stream, 24);
SA_FFI_AT(XLA_FFI_Metadata_Extension, extension_base.type, 8);
SA_FFI_AT(XLA_FFI_Metadata_Extension, metadata, 24);
SA_FFI_AT(XLA_FFI_Metadata, api_version, 8);
SA_FFI_AT(XLA_FFI_Metadata, traits, 32);
SA_FFI_AT(XLA_FFI_Api_Version, major_version, 16);
SA_FFI_AT(XLA_FFI_Api_Version, minor_version, 20);
SA_FFI_AT(XLA_FFI_Api, XLA_FFI_Error_Create, 48);
SA_FFI_AT(XLA_FFI_Api, XLA_FFI_Stream_Get, 80);
_Static_assert(XLA_FFI_Error_Create_Args_STRUCT_SIZE == 28 && XLA_FFI_Stream_Get_Args_STRUCT_SIZE == 32,
               "argument struct sizes differ from FFI API 0.1");
_Static_assert(XLA_FFI_Extension_Metadata == 1 && XLA_FFI_ExecutionStage_EXECUTE == 3 && XLA_FFI_ArgType_BUFFER == 1 &&
                   XLA_FFI_RetType_BUFFER == 1 && XLA_FFI_AttrType_SCALAR == 3,
               "FFI enum values differ from FFI API 0.1");
_Static_assert(XLA_FFI_Error_Code_INVALID_ARGUMENT == 3 && XLA_FFI_Error_Code_RESOURCE_EXHAUSTED == 8 &&
                   XLA_FFI_Error_Code_UNIMPLEMENTED == 12 && XLA_FFI_Error_Code_INTERNAL == 13,
               "FFI error codes differ from FFI API 0.1");
_Static_assert(XLA_FFI_DataType_PRED == 1 && XLA_FFI_DataType_S16 == 3 && XLA_FFI_DataType_S32 == 4 &&
                   XLA_FFI_DataType_S64 == 5 && XLA_FFI_DataType_U8 == 6 && XLA_FFI_DataType_U16 == 7 &&
                   XLA_FFI_DataType_U32 == 8 && XLA_FFI_DataType_U64 == 9 && XLA_FFI_DataType_F16 == 10 &&
                   XLA_FFI_DataType_F32 == 11 && XLA_FFI_DataType_F64 == 12 && XLA_FFI_DataType_BF16 == 16,
               "FFI dtype values differ from FFI API 0.1");

int sa_ffi_metadata(XLA_FFI_CallFrame *f, uint32_t traits) {
  if (!f->extension_start || f->extension_start->type != XLA_FFI_Extension_Metadata) return 0;
  XLA_FFI_Metadata_Extension *ext = (XLA_FFI_Metadata_Extension *)(void *)f->extension_start;
  ext->metadata->api_version.major_version = SA_FFI_API_MAJOR;
  ext->metadata->api_version.minor_version = SA_FFI_API_MINOR;
  ext->metadata->traits = traits;
  return 1;
}

/* The declared FFI API version (major * 1000 + minor), which Python compares with the running jaxlib's
   before registering the handlers. */
SA_FFI_EXPORT int sa_jax_ffi_api_version(void) { return SA_FFI_API_MAJOR * 1000 + SA_FFI_API_MINOR; }
