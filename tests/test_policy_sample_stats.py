"""kevin_jax.policy.sample_stats: the chunks' maxima and sums of exp in one Pallas pass, against the jnp reference
and sample_logits' XLA path: in interpret mode on the CPU, and compiled by Triton on the GPU (marker gpu)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kevin_jax.policy import sampling as sampler
from kevin_jax.policy.decode import sample_stats

NAMES = ("m_raw", "s_raw", "m_masked", "s_scaled")


def _logits(b, v, dtype=jnp.float32, seed=0):
  return (jax.random.normal(jax.random.key(seed), (b, v), jnp.float32) * 4.0).astype(dtype)


def _check_stats(got, want, rtol):
  for name, g, w in zip(NAMES, got, want):
    g, w = np.asarray(g), np.asarray(w)
    assert g.shape == w.shape, name
    np.testing.assert_array_equal(np.isfinite(g), np.isfinite(w), err_msg=name)
    fin = np.isfinite(w)
    if name.startswith("m"):  # maxima (and -inf) exactly
      np.testing.assert_array_equal(g, w, err_msg=name)
    else:
      np.testing.assert_allclose(g[fin], w[fin], rtol=rtol, atol=0, err_msg=name)


@pytest.mark.parametrize("b,v,chunks,valid,t,dtype", [
    (4, 4096, 8, 4000, 0.7, "float32"),  # masked columns in the last chunk only
    (8, 5000, 32, 5000, 1.3, "float32"),  # C = 19 (V // 256), a short last chunk, no mask
    (2, 4100, 4, 2000, 0.9, "bfloat16"),  # whole chunks masked (their max is _NEG, their sum counts them)
    (3, 1030, 2, 1030, 0.5, "float32"),  # W = 515: a 1024-column tile from column 0 or ending at V
])
@pytest.mark.parametrize("block", [{}, dict(block_m=2, block_n=128)])  # one tile per chunk; several, rescaled
def test_matches_reference_interpret(b, v, chunks, valid, t, dtype, block):
  c, w = sample_stats.chunk_layout(v, chunks)
  x = _logits(b, v, jnp.dtype(dtype))
  x = x.at[0, : w + 7].set(-jnp.inf)  # a row whose first chunk is all -inf: max -inf, sum 0
  got = sample_stats.chunk_stats(x, jnp.float32(t), chunks=chunks, valid_vocab=valid, interpret=True, **block)
  want = sample_stats.reference(x, jnp.float32(t), chunks=chunks, valid_vocab=valid)
  _check_stats(got, want, rtol=2e-6)
  assert np.all(np.asarray(got[1])[0, :1] == 0) and np.isneginf(np.asarray(got[0])[0, 0])
  # The reference is sampler's own chunk statistics (the XLA path's), on the same chunk layout.
  m, s = sampler._chunk_stats(sampler._chunked(x.astype(jnp.float32), chunks))
  assert m.shape == (b, c) and sampler._chunked(x, chunks).shape == (b, c, w)
  _check_stats((m, s), want[:2], rtol=1e-6)


@pytest.mark.parametrize("valid", [3000, 4096])
def test_sample_logits_kernel_path_equals_xla_interpret(valid):
  """Same tokens for the same keys, log-probs within 1e-5, with the stats from the kernel or from XLA."""
  b, v = 16, 4096
  x = _logits(b, v, seed=1)
  keys = jax.random.split(jax.random.key(3), b)
  kw = dict(top_k=0, greedy=False, use_top_p=False, valid_vocab=valid, reduce_chunks=8)
  t, top_p = jnp.float32(0.9), jnp.float32(1.0)
  want = sampler.sample_logits(x, keys, t, top_p, stats="xla", **kw)
  got = sampler.sample_logits(x, keys, t, top_p, stats="interpret", **kw)
  np.testing.assert_array_equal(got[0], want[0])
  assert np.all(np.asarray(got[0]) < valid)
  np.testing.assert_allclose(got[1], want[1], rtol=0, atol=1e-5)
  np.testing.assert_allclose(got[2], want[2], rtol=0, atol=1e-5)
  # The raw log-prob is log_softmax of the unmasked logits at the token, the sampling one that of masked x / T.
  tok = np.asarray(got[0])
  raw = jax.nn.log_softmax(x, axis=-1)[np.arange(b), tok]
  scaled = jax.nn.log_softmax(jnp.where(jnp.arange(v) < valid, x, sampler._NEG) / t, axis=-1)[np.arange(b), tok]
  np.testing.assert_allclose(got[1], raw, rtol=0, atol=1e-5)
  np.testing.assert_allclose(got[2], scaled, rtol=0, atol=1e-5)


def test_stats_impl_rules():
  impl = lambda stats, **kw: sampler.stats_impl(stats, **{**dict(vocab=151936, reduce_chunks=32, top_k=0,
                                                                  greedy=False, use_top_p=False), **kw})
  assert impl("pallas") == "pallas" and impl("interpret") == "interpret" and impl("xla") == "xla"
  assert impl("auto") == ("pallas" if jax.default_backend() == "gpu" else "xla")
  assert impl("pallas", greedy=True) == impl("pallas", top_k=50) == impl("pallas", use_top_p=True) == "xla"
  assert impl("pallas", vocab=500) == impl("pallas", reduce_chunks=1) == "xla"  # fewer than 2 chunks
  assert impl("auto", scalar_temperature=False) == "xla"  # a per-row temperature: XLA's path
  with pytest.raises(ValueError, match="stats must be one of"):
    impl("cuda")


def test_errors_and_lowering():
  x = _logits(2, 1024)
  with pytest.raises(ValueError, match=">= 2 chunks"):
    sample_stats.chunk_stats(x, jnp.float32(1.0), chunks=1, valid_vocab=1024, interpret=True)
  with pytest.raises(ValueError, match="temperature must be a scalar"):
    sample_stats.chunk_stats(x, jnp.ones((2,)), chunks=4, valid_vocab=1024, interpret=True)
  with pytest.raises(ValueError, match="power of two"):
    sample_stats.chunk_stats(x, jnp.float32(1.0), chunks=4, valid_vocab=1024, block_n=48, interpret=True)
  # The 0.5B decode step's shape lowers through Pallas' Triton backend for a GPU target: one Triton call that
  # takes the whole [64, V] logits.
  spec = jax.ShapeDtypeStruct
  fn = jax.jit(lambda x, t: sample_stats.chunk_stats(x, t, chunks=32, valid_vocab=151665))
  text = fn.trace(spec((64, 151936), jnp.float32), spec((), jnp.float32)).lower(
      lowering_platforms=("cuda",)).as_text()
  call = [line for line in text.splitlines() if "__gpu$xla.gpu.triton" in line]
  assert len(call) == 1 and "tensor<64x151936xf32>" in call[0]


@pytest.mark.gpu
@pytest.mark.parametrize("valid", [151665, 151936])
def test_kernel_on_gpu(valid):
  """The compiled kernel at the 0.5B decode step's shape: its stats against the reference, and sample_logits'
  tokens and log-probs against the XLA path's."""
  b, v = 64, 151936
  x = _logits(b, v, seed=2)
  t = jnp.float32(0.9)
  got = sample_stats.chunk_stats(x, t, chunks=32, valid_vocab=valid)
  want = jax.jit(lambda x, t: sample_stats.reference(x, t, chunks=32, valid_vocab=valid))(x, t)
  _check_stats(got, want, rtol=5e-6)
  keys = jax.random.split(jax.random.key(4), b)
  kw = dict(top_k=0, greedy=False, use_top_p=False, valid_vocab=valid, reduce_chunks=32)
  fn = jax.jit(lambda x, k, stats: sampler.sample_logits(x, k, t, jnp.float32(1.0), stats=stats, **kw),
               static_argnums=2)
  tok, raw, samp = fn(x, keys, "pallas")
  tok_x, raw_x, samp_x = fn(x, keys, "xla")
  np.testing.assert_array_equal(tok, tok_x)
  np.testing.assert_allclose(raw, raw_x, rtol=0, atol=1e-5)
  np.testing.assert_allclose(samp, samp_x, rtol=0, atol=1e-5)
