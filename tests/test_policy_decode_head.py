"""The fused LM head + sampling kernel (policy/decode_head.py): against its jnp reference and float64 numpy in
interpret mode on the CPU, its hash noise and the distribution it draws from, its Triton lowering, and on the GPU
(marker gpu; JAX_PLATFORMS=cuda,cpu) compiled by Triton."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kevin_jax.policy import Qwen2, get_preset
from kevin_jax.policy import decode_head
from kevin_jax.policy.sampler import Sampler, SamplerConfig, head_impl

_NEG = -1e30


def _case(b, d, v, dtype, head_vd, seed=0):
  rng = np.random.default_rng(seed)
  h = jnp.asarray(rng.standard_normal((b, d)), dtype)
  w_np = rng.standard_normal((v, d)) * 2.0 * d ** -0.5
  w = jnp.asarray(w_np if head_vd else w_np.T, dtype)
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(seed), i))(jnp.arange(b))
  return h, w, keys


def _logits64(h, w, head_vd):
  h64, w64 = np.asarray(h, np.float64), np.asarray(w, np.float64)
  return h64 @ (w64.T if head_vd else w64)


def _assert_matches_reference(stats, h, w, keys, t, head_vd, greedy, valid):
  """finish(stats) against `reference`: the same tokens, log-probs within fp32 rounding; returns finish's arrays."""
  b = h.shape[0]
  got = [np.asarray(a) for a in decode_head.finish(stats, b, t, greedy)]
  want = [np.asarray(a) for a in decode_head.reference(h, w, keys, t, head_vd=head_vd, greedy=greedy,
                                                       valid_vocab=valid)]
  np.testing.assert_array_equal(got[0], want[0])
  np.testing.assert_allclose(got[1], want[1], rtol=0, atol=1e-5)
  np.testing.assert_allclose(got[2], want[2], rtol=0, atol=1e-5)
  return got


def _log_softmax(x):
  x = x - x.max(axis=1, keepdims=True)
  return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("b,d,v,head_vd,greedy,valid,block_n", [
    (5, 64, 384, True, False, 300, 128), (5, 64, 384, False, False, 384, 128), (16, 128, 512, True, True, 500, 64),
    (3, 48, 272, False, True, 272, 128), (33, 64, 256, True, False, 200, 32)])
def test_kernel_matches_reference_and_log_softmax_fp32(b, d, v, head_vd, greedy, valid, block_n):
  """Interpret mode against `reference` (the same noise over whole rows): the same tokens; log-probs within fp32
  rounding of reference and of float64 log_softmax, raw and of the sampled distribution (masked x / T)."""
  h, w, keys = _case(b, d, v, jnp.float32, head_vd)
  t = jnp.float32(0.7)
  stats = decode_head.head_stats(h, w, keys, t, head_vd=head_vd, greedy=greedy, valid_vocab=valid, block_n=block_n,
                                 interpret=True)
  assert stats.pick_col.shape == (v // min(block_n, v & -v), max(16, 1 << (b - 1).bit_length()))
  got = _assert_matches_reference(stats, h, w, keys, t, head_vd, greedy, valid)
  tok = got[0]
  assert got[0].dtype == np.int32 and np.all((tok >= 0) & (tok < valid))
  logits = _logits64(h, w, head_vd)
  rows = np.arange(b)
  np.testing.assert_allclose(got[1], _log_softmax(logits)[rows, tok], rtol=0, atol=1e-5)
  masked = np.where(np.arange(v)[None, :] < valid, logits, _NEG)
  if greedy:
    np.testing.assert_array_equal(tok, masked.argmax(axis=1))
    assert np.all(got[2] == 0)
  else:
    np.testing.assert_allclose(got[2], _log_softmax(masked / 0.7)[rows, tok], rtol=0, atol=1e-5)
    assert len(set(tok.tolist())) > 1


@pytest.mark.parametrize("b,v,greedy,valid,block_m", [(5, 384, False, 300, 32), (16, 512, True, 500, 16),
                                                     (64, 256, False, 256, 32)])
def test_logits_stats_matches_reference(b, v, greedy, valid, block_m):
  """The stats-only kernel (XLA's GEMM writes the logits; sample(fuse_gemm=False)) in interpret mode: the same
  tokens as `reference`, log-probs within fp32 rounding."""
  h, w, keys = _case(b, 64, v, jnp.float32, True, seed=3)
  t = jnp.float32(1.3)
  logits = jnp.einsum("bd,vd->bv", h, w, precision=jax.lax.Precision.HIGHEST)
  stats = decode_head.logits_stats(logits, keys, t, greedy=greedy, valid_vocab=valid, block_m=block_m,
                                   interpret=True)
  got = _assert_matches_reference(stats, h, w, keys, t, True, greedy, valid)
  via_sample = decode_head.sample(h, w, keys, t, head_vd=True, greedy=greedy, valid_vocab=valid, fuse_gemm=False,
                                  interpret=True)
  np.testing.assert_array_equal(np.asarray(via_sample[0]), got[0])


def test_masked_columns_are_never_picked():
  """Columns >= valid_vocab with by far the largest logits: greedy and sampling still pick a valid column, and the
  raw log-prob keeps them in its normaliser (log_softmax over the full vocabulary)."""
  b, d, v, valid = 8, 32, 256, 200
  h, w, keys = _case(b, d, v, jnp.float32, True, seed=1)
  w = w.at[valid:].set(h[0] * 10.0)  # aligned with the hidden states: logits of ~10 |h|^2
  for greedy, fuse in ((True, True), (False, True), (False, False)):
    tok, raw, _ = (np.asarray(a) for a in decode_head.sample(h, w, keys, jnp.float32(1.0), head_vd=True,
                                                            greedy=greedy, valid_vocab=valid, fuse_gemm=fuse,
                                                            interpret=True))
    assert np.all(tok < valid)
    logits = _logits64(h, w, True)
    np.testing.assert_allclose(raw, _log_softmax(logits)[np.arange(b), tok], rtol=0, atol=1e-4)


def test_bf16_weights_fp32_logits():
  """bf16 head and hidden states with fp32 logits (the 0.5B sampler's case) and bf16 logits (fp32_upcast off):
  the same tokens as `reference`, log-probs within fp32 rounding of it."""
  h, w, keys = _case(16, 128, 512, jnp.bfloat16, True, seed=2)
  for logits_dtype in (jnp.float32, jnp.bfloat16):
    got = decode_head.sample(h, w, keys, jnp.float32(0.9), head_vd=True, greedy=False, valid_vocab=512,
                             logits_dtype=logits_dtype, interpret=True)
    want = decode_head.reference(h, w, keys, jnp.float32(0.9), head_vd=True, greedy=False, valid_vocab=512,
                                 logits_dtype=logits_dtype)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want[1]), rtol=0, atol=1e-4)


def test_hash_uniform_statistics():
  """hash_uniform over 256 keys x 4,096 columns: inside (0, 1); 64 equal bins within 5 standard deviations of
  their expected count and a chi-square within 6 standard deviations of its degrees of freedom; neighbouring
  columns and neighbouring keys uncorrelated (|r| < 0.01 over 1M pairs, whose standard error is 0.001)."""
  keys = np.asarray(jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(0), i))(jnp.arange(256)))
  cols = jnp.arange(4096, dtype=jnp.uint32)
  u = np.asarray(decode_head.hash_uniform(jnp.asarray(keys[:, :1]), jnp.asarray(keys[:, 1:]), cols[None, :]),
                 np.float64)
  assert u.shape == (256, 4096) and u.min() > 0 and u.max() < 1
  n = u.size
  counts = np.bincount((u * 64).astype(int).ravel(), minlength=64)
  expected = n / 64
  assert np.all(np.abs(counts - expected) <= 5 * np.sqrt(expected * (1 - 1 / 64)))
  chi2 = float(np.sum((counts - expected) ** 2 / expected))
  assert chi2 < 63 + 6 * np.sqrt(2 * 63), chi2
  assert abs(np.corrcoef(u[:, :-1].ravel(), u[:, 1:].ravel())[0, 1]) < 0.01
  assert abs(np.corrcoef(u[:-1].ravel(), u[1:].ravel())[0, 1]) < 0.01
  assert abs(u.mean() - 0.5) < 0.002


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_draws_follow_the_softmax(temperature):
  """40,000 draws (one key each) from one row of 600 logits, 57 of them masked past valid_vocab = 543: masked
  columns never drawn; every column's count within 5 standard deviations of N p, p = softmax(x / T) over the valid
  columns; Pearson's chi-square within 6 standard deviations of its degrees of freedom."""
  v, valid, n, d = 600, 543, 40_000, 16
  rng = np.random.default_rng(int(temperature * 10))
  # One hidden row repeated: logits x = h . w_j, spread like a policy's (std ~2).
  h = jnp.asarray(np.broadcast_to(rng.standard_normal(d), (n, d)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((v, d)) * 0.5, jnp.float32)
  keys = jax.random.split(jax.random.PRNGKey(7), n)
  draw = jax.jit(lambda h, k: decode_head.reference(h, w, k, jnp.float32(temperature), head_vd=True,
                                                    greedy=False, valid_vocab=valid))
  tokens = np.asarray(draw(h, keys)[0])
  counts = np.bincount(tokens, minlength=v)
  assert counts[valid:].sum() == 0
  x = _logits64(h[:1], w, True)[0, :valid] / temperature
  p = np.exp(x - x.max())
  p /= p.sum()
  counts = counts[:valid]
  sd = np.sqrt(n * p * (1 - p))
  assert np.all(np.abs(counts - n * p) <= 5 * sd + 1), np.max(np.abs(counts - n * p) / (sd + 1e-9))
  big = n * p >= 5
  observed = np.append(counts[big], counts[~big].sum())
  expected = np.append(n * p[big], n * p[~big].sum())
  chi2, df = float(np.sum((observed - expected) ** 2 / expected)), len(observed) - 1
  assert chi2 < df + 6 * np.sqrt(2 * df), (chi2, df)


@pytest.mark.parametrize("head_vd", [True, False])
def test_lowers_to_triton(head_vd):
  """The kernels lower through Pallas' Triton backend for a GPU target on the CPU (0.5B shape, 64 rows): one
  Triton call that takes the whole head (head_stats) or the whole [64, V] logits (logits_stats), greedy and
  sampling."""
  spec = lambda dt, *shape: jax.ShapeDtypeStruct(shape, dt)
  w = spec(jnp.bfloat16, 151936, 896) if head_vd else spec(jnp.bfloat16, 896, 151936)
  for greedy in (False, True):
    fn = jax.jit(lambda h, w, k, t, g=greedy: decode_head.head_stats(h, w, k, t, head_vd=head_vd, greedy=g,
                                                                      valid_vocab=151665))
    text = fn.trace(spec(jnp.bfloat16, 64, 896), w, spec(jnp.uint32, 64, 2), spec(jnp.float32)).lower(
        lowering_platforms=("cuda",)).as_text()
    call = [line for line in text.splitlines() if "__gpu$xla.gpu.triton" in line]
    shape = "tensor<151936x896xbf16>" if head_vd else "tensor<896x151936xbf16>"
    assert len(call) == 1 and shape in call[0]
    stats = jax.jit(lambda x, k, t, g=greedy: decode_head.logits_stats(x, k, t, greedy=g, valid_vocab=151665))
    text = stats.trace(spec(jnp.float32, 64, 151936), spec(jnp.uint32, 64, 2), spec(jnp.float32)).lower(
        lowering_platforms=("cuda",)).as_text()
    call = [line for line in text.splitlines() if "__gpu$xla.gpu.triton" in line]
    assert len(call) == 1 and "tensor<64x151936xf32>" in call[0]


def test_shape_rules_and_errors():
  assert decode_head.supported(896, 151936) and decode_head.supported(5120, 152064)
  assert not decode_head.supported(40, 256) and not decode_head.supported(64, 100)
  h, w, keys = _case(4, 64, 256, jnp.float32, True)
  with pytest.raises(ValueError, match="multiples of 16"):
    decode_head.head_stats(h, w[:100], keys, jnp.float32(1.0), head_vd=True, greedy=False, valid_vocab=100)
  with pytest.raises(ValueError, match="head must be"):
    decode_head.head_stats(h, w, keys, jnp.float32(1.0), head_vd=False, greedy=False, valid_vocab=256)
  with pytest.raises(ValueError, match="keys must be"):
    decode_head.head_stats(h, w, keys[:3], jnp.float32(1.0), head_vd=True, greedy=False, valid_vocab=256)
  with pytest.raises(ValueError, match="decode_head"):
    SamplerConfig(decode_head="fast")


def test_head_impl_resolution():
  """'auto' is the kernel only on a GPU, for at most MAX_ROWS rows; top-k and top-p always take the XLA path."""
  cfg = get_preset("tiny")
  assert SamplerConfig().decode_head == "xla"  # opt-in
  assert head_impl("interpret", cfg, 4, 0, False) == "interpret"
  assert head_impl("pallas", cfg, 4, 5, False) == "xla" and head_impl("interpret", cfg, 4, 0, True) == "xla"
  want = "pallas" if jax.default_backend() == "gpu" else "xla"
  assert head_impl("auto", cfg, decode_head.MAX_ROWS, 0, False) == want
  assert head_impl("auto", cfg, decode_head.MAX_ROWS + 1, 0, False) == "xla"


@pytest.mark.gpu
@pytest.mark.parametrize("head_vd,greedy,fuse", [(True, False, True), (False, True, True), (True, True, True),
                                                 (True, False, False)])
def test_kernel_on_gpu(head_vd, greedy, fuse):
  """Compiled by Triton at the 0.5B shape (64 rows, 151,936 columns, bf16 head, fp32 logits): the same tokens as
  `reference` (XLA on the GPU) for all but near-ties, log-probs within bf16-GEMM accumulation-order differences."""
  if jax.default_backend() != "gpu":
    pytest.skip("needs a GPU")
  h, w, keys = _case(64, 896, 151936, jnp.bfloat16, head_vd, seed=4)
  t = jnp.float32(0.9)
  kw = dict(head_vd=head_vd, greedy=greedy, valid_vocab=151665)
  got = [np.asarray(a) for a in jax.jit(lambda *a: decode_head.sample(*a, **kw, fuse_gemm=fuse))(h, w, keys, t)]
  want = [np.asarray(a) for a in jax.jit(lambda *a: decode_head.reference(*a, **kw))(h, w, keys, t)]
  assert np.mean(got[0] == want[0]) >= 0.95, np.mean(got[0] == want[0])
  same = got[0] == want[0]
  np.testing.assert_allclose(got[1][same], want[1][same], rtol=0, atol=2e-3)
  np.testing.assert_allclose(got[2][same], want[2][same], rtol=0, atol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("fuse", [True, False])
def test_sampler_with_kernel_on_gpu(fuse, monkeypatch):
  """Sampler(decode_head='pallas') on the GPU, a tiny fp32 model (IEEE fp32 matmuls, as the kernel's): log-probs
  equal a fresh forward pass's within 1e-4 (raw and at T = 0.7), the same tokens for one seed twice, and greedy
  decoding equals the XLA path's; with the GEMM in the kernel and with XLA's GEMM + logits_stats."""
  if jax.default_backend() != "gpu":
    pytest.skip("needs a GPU")
  monkeypatch.setattr(decode_head, "sample", functools.partial(decode_head.sample, fuse_gemm=fuse))
  with jax.default_matmul_precision("highest"):
    _sampler_check("pallas")


def _sampler_check(impl):
  from flax import nnx  # pylint: disable=g-import-not-at-top
  cfg = get_preset("tiny", param_dtype="float32", compute_dtype="float32")
  model = Qwen2(cfg, rngs=nnx.Rngs(5))
  prompts = [[5, 9, 11], list(range(20, 60)), [3] * 7]
  outs = {}
  for head in ("xla", impl):
    sampler = Sampler(cfg, None, SamplerConfig(batch_size=4, prompt_buckets=(64,), kv_cache_dtype="float32",
                                               decode_head=head))
    outs[head] = [sampler.generate(model, prompts, seed=s, max_new_tokens=24, temperature=t, eos_ids=[])
                  for s, t in ((0, 0.0), (1, 0.7), (1, 0.7))]
  greedy, hot, again = outs[impl]
  assert greedy.tokens == outs["xla"][0].tokens
  assert hot.tokens == again.tokens and hot.tokens != outs["xla"][1].tokens  # another noise, deterministic
  tokens = jnp.asarray([p + t for p, t in zip(prompts, hot.tokens)][0])[None]
  logits = np.asarray(model(tokens, jnp.arange(tokens.shape[1])[None])[0][0], np.float64)
  steps = np.arange(len(prompts[0]) - 1, tokens.shape[1] - 1)
  tok = np.asarray(hot.tokens[0])
  np.testing.assert_allclose(hot.logprobs[0], _log_softmax(logits)[steps, tok], rtol=0, atol=1e-4)
  np.testing.assert_allclose(hot.sampling_logprobs[0], _log_softmax(logits / 0.7)[steps, tok], rtol=0, atol=1e-4)


@pytest.mark.parametrize("fuse", [True, False])
def test_sampler_with_kernel_interpret(fuse, monkeypatch):
  """The same checks with the kernels in interpret mode on the CPU."""
  monkeypatch.setattr(decode_head, "sample", functools.partial(decode_head.sample, fuse_gemm=fuse))
  _sampler_check("interpret")
