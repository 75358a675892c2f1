/* cuda_mock.h — controls of the CUDA runtime mock (cuda_mock.cpp). */
#ifndef SA_CUDA_MOCK_H
#define SA_CUDA_MOCK_H
#include <stddef.h>
#include <stdio.h>

typedef struct {
  int cc_major, cc_minor, sms, ctx_sms, smem_optin, smem_per_sm;
  const char *name;
} sa_mock_device;

/* Writes the kernel-specific fields of a launch (its arguments, by kernel name) into buf. */
typedef void (*sa_mock_decoder)(const char *kernel, void **args, char *buf, size_t n);

#ifdef __cplusplus
extern "C" {
#endif
void sa_mock_log_set(FILE *f);
void sa_mock_device_set(const sa_mock_device *d);
void sa_mock_refuse_cooperative(int on);
void sa_mock_decoder_set(sa_mock_decoder d);
#ifdef __cplusplus
}
#endif
#endif
