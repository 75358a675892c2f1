"""Smoke test of examples/demo.py (`make demo`) with tiny flags: it trains the sink model and its vanilla twin,
compares, reports and plots."""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import demo  # noqa: E402
from demo_data import CharCorpus, vocabulary  # noqa: E402


def test_corpus_round_trip_and_batches():
  corpus = CharCorpus(5_000, seed=3)
  assert corpus.vocab_size == len(vocabulary()) and corpus.decode(corpus.encode(corpus.text)) == corpus.text
  assert len(corpus.text) == 5_000 and " has a " in corpus.text
  batch = corpus.batch(np.random.default_rng(0), 3, 16)
  assert batch.shape == (3, 17) and batch.dtype == np.int32 and batch.max() < corpus.vocab_size


def test_demo_trains_both_models_and_writes_plot(tmp_path):
  out = tmp_path / "out"
  flags = "--steps 40 --batch 8 --seq-len 48 --layers 2 --d-model 32 --heads 4 --kv-heads 2 --window 8 --lr 1e-2"
  flags += " --compare-steps 2 --generate 12 --corpus-chars 20000 --no-progress"
  summary = demo.main(flags.split() + ["--out", str(out)])
  png = out / "demo.png"
  assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  saved = json.loads((out / "summary.json").read_text())
  for losses in (saved["losses"], saved["twin_losses"]):  # the learnable model, then its vanilla twin
    assert len(losses) == 40 and np.all(np.isfinite(losses))
    assert np.mean(losses[-5:]) < losses[0] - 0.8, losses  # ln(28) = 3.3 nats at the start
  assert saved["losses"] != saved["twin_losses"]
  assert set(saved["step_seconds"]) == {"fused", "reference"}
  assert np.shape(saved["sinks"]) == (2, 4) and np.shape(saved["sink_mass"]) == (2, 4)
  mass = np.asarray(saved["sink_mass"])
  assert np.all((mass > 0) & (mass < 1))
  assert summary["sample"].startswith("zoe has a green fox. ") and len(summary["sample"]) == 21 + 12


def test_vanilla_demo_has_no_twin(tmp_path):
  flags = "--steps 3 --batch 2 --seq-len 16 --layers 2 --d-model 16 --heads 2 --kv-heads 1 --window 4"
  flags += " --compare-steps 0 --generate 0 --corpus-chars 2000 --no-progress --softmax-type vanilla"
  summary = demo.main(flags.split() + ["--out", str(tmp_path)])
  assert summary["twin_losses"] is None and len(summary["losses"]) == 3
  assert (tmp_path / "demo.png").stat().st_size > 10_000


def test_generate_matches_argmax_of_full_forward():
  """Greedy-like sampling (temperature -> 0) through the KV cache picks the full forward's argmax."""
  corpus = CharCorpus(2_000)
  model = demo.LanguageModel(corpus.vocab_size, d_model=32, layers=2, heads=4, kv_heads=2, window=4)
  params = model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
  prompt = jnp.asarray(corpus.encode("tom has a red cat. "))[None, :]
  tokens = demo.generate(model, params, prompt, 6, jax.random.key(1), temperature=1e-4)
  logits = model.apply({"params": params}, tokens[:, :-1])
  np.testing.assert_array_equal(tokens[0, prompt.shape[1] :], jnp.argmax(logits[0, prompt.shape[1] - 1 :], -1))


def test_sink_report_without_learnable_sinks():
  """Vanilla puts no mass on the sink; off-by-one a mass in (0, 1) from its zero logit."""
  corpus = CharCorpus(2_000)
  batch = jnp.asarray(corpus.tokens[:32])[None, :]
  for softmax_type, sink in (("vanilla", -np.inf), ("off_by_one", 0.0)):
    model = demo.LanguageModel(
      corpus.vocab_size, d_model=16, layers=2, heads=2, kv_heads=1, window=4, softmax_type=softmax_type
    )
    params = model.init(jax.random.key(0), batch)["params"]
    for sinks, mass in demo.sink_report(model, params, batch):
      assert np.all(sinks == sink)
      assert np.all(mass == 0) if softmax_type == "vanilla" else np.all((mass > 0) & (mass < 1))
