"""The decode step's fused q/k/v kernel (policy/decode/qkv.py: input RMSNorm, projection, biases, RoPE, cache
write, q padded for decode_attention) against a float64 NumPy reference: in interpret mode on the CPU, lowered to
Triton IR for the GPU (on the CPU, no GPU needed), and compiled by Triton on the GPU (marker gpu;
JAX_PLATFORMS=cuda,cpu)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kevin_jax.policy.decode import attention as decode_attention
from kevin_jax.policy.decode import qkv as decode_qkv
from kevin_jax.policy import get_preset
from kevin_jax.policy.decode.attention import SlotRanges, padded_rows
from kevin_jax.policy.decode.qkv import qkv_rope_cache, split_block, supported
from kevin_jax.policy.model import apply_rope, rope_cos_sin


def _case(b, d, n, kh, h, s, dtype, seed=0):
  """Inputs of one decode step: x, the six weights/biases, cos/sin of random positions, caches of noise, a slot."""
  rng = np.random.default_rng(seed)
  arr = lambda *shape, scale=1.0: jnp.asarray(rng.standard_normal(shape) * scale, dtype)
  x = arr(b, d, scale=3.0)
  weights = (arr(d, n, h, scale=d ** -0.5), arr(d, kh, h, scale=d ** -0.5), arr(d, kh, h, scale=d ** -0.5),
             arr(n, h), arr(kh, h), arr(kh, h))
  positions = jnp.asarray(rng.integers(0, 5000, (b, 1)))
  cos, sin = rope_cos_sin(positions, h, 1e6)
  caches = (arr(b, kh, s, h), arr(b, kh, s, h))
  return x, weights, cos[:, 0], sin[:, 0], caches, int(rng.integers(0, s))


def _reference(x, weights, cos, sin, caches, slot):
  """float64: q [B, N, H] rotated, and the caches with k (rotated) and v written at `slot`."""
  x, wq, wk, wv, bq, bk, bv, cos, sin = (np.asarray(a, np.float64) for a in (x, *weights, cos, sin))

  def rotate(t):  # t [B, heads, H]: rotate-half with each row's cos/sin [B, H/2]
    t1, t2 = np.split(t, 2, axis=-1)
    c, s = cos[:, None], sin[:, None]
    return np.concatenate([t1 * c - t2 * s, t2 * c + t1 * s], axis=-1)

  q = rotate(np.einsum("bd,dnh->bnh", x, wq) + bq)
  k = rotate(np.einsum("bd,dkh->bkh", x, wk) + bk)
  v = np.einsum("bd,dkh->bkh", x, wv) + bv
  kc, vc = (np.array(c, np.float64) for c in caches)
  kc[:, :, slot], vc[:, :, slot] = k, v
  return q, kc, vc


def _check(got, want, kh, groups, rtol, atol):
  q, kc, vc = (np.asarray(a, np.float64) for a in got)
  b, _, gp, h = q.shape
  assert gp == padded_rows(groups)
  np.testing.assert_allclose(q[:, :, :groups].reshape(b, kh * groups, h), want[0], rtol=rtol, atol=atol)
  assert not np.any(q[:, :, groups:])  # decode_attention's padding rows are zero
  np.testing.assert_allclose(kc, want[1], rtol=rtol, atol=atol)
  np.testing.assert_allclose(vc, want[2], rtol=rtol, atol=atol)


@pytest.mark.parametrize("b,d,n,kh,h,block_m,block_w", [
    (16, 64, 4, 2, 32, 64, 16),  # the tiny test model's attention with 32-wide heads
    (32, 128, 14, 2, 64, 16, 16),  # 0.5B's GQA 7:1 and head size; two row blocks
    (48, 96, 6, 2, 128, 64, 32),  # 1.5B's GQA 6:1 and head size; 48 rows -> row blocks of 16
    (16, 256, 16, 2, 64, 64, 32),  # G = 8: padding rows 8..15; one program per 64-wide head
    (64, 128, 32, 2, 32, 64, 16),  # G = 16: no padding rows
])
def test_matches_reference_fp32(b, d, n, kh, h, block_m, block_w):
  x, weights, cos, sin, caches, slot = _case(b, d, n, kh, h, 40, jnp.float32)
  got = qkv_rope_cache(x, *weights, cos, sin, *caches, slot, block_m=block_m, block_w=block_w,
                       interpret=True)
  assert [a.dtype for a in got] == [jnp.float32] * 3
  _check(got, _reference(x, weights, cos, sin, caches, slot), kh, n // kh, rtol=1e-5, atol=1e-5)


def test_bf16_error_is_bf16_rounding():
  """bf16: fp32 accumulation, bias and rotation, then one bf16 rounding (relative error <= 2^-8); the untouched
  cache slots are the bf16 inputs themselves."""
  x, weights, cos, sin, caches, slot = _case(16, 128, 14, 2, 64, 24, jnp.bfloat16, seed=1)
  got = qkv_rope_cache(x, *weights, cos, sin, *caches, slot, interpret=True)
  assert [a.dtype for a in got] == [jnp.bfloat16] * 3
  want = _reference(x, weights, cos, sin, caches, slot)
  _check(got, want, 2, 7, rtol=2 ** -8, atol=1e-6)
  # No worse than the model's own bf16 XLA path (projection, bias and rotation each rounded to bf16).
  q_xla = jnp.einsum("bd,dnh->bnh", x, weights[0]) + weights[3][None]
  q_xla = apply_rope(q_xla[:, None], cos[:, None], sin[:, None], True)[:, 0]
  err_xla = np.max(np.abs(np.asarray(q_xla, np.float64) - want[0]))
  err = np.max(np.abs(np.asarray(got[0], np.float64)[:, :, :7].reshape(want[0].shape) - want[0]))
  assert 0 < err <= err_xla, (err, err_xla)


def test_shape_rules():
  assert supported(64, 896, 64) and supported(16, 5120, 128) and supported(48, 64, 32)
  assert not supported(8, 896, 64)  # fewer than 16 rows
  assert not supported(40, 896, 64)  # 40 rows: no power-of-two block >= 16 divides it
  assert not supported(64, 896, 16)  # head_dim / 2 = 8 < one 16-column tile
  assert not supported(64, 40, 64)  # D not a multiple of 16
  x, weights, cos, sin, caches, slot = _case(8, 64, 4, 2, 32, 16, jnp.float32)
  with pytest.raises(ValueError, match="multiple of 16"):
    qkv_rope_cache(x, *weights, cos, sin, *caches, slot, interpret=True)
  x, weights, cos, sin, caches, slot = _case(16, 64, 4, 2, 32, 16, jnp.float32)
  with pytest.raises(ValueError, match="cache must be"):
    qkv_rope_cache(x, *weights, cos, sin, caches[0][:, :1], caches[1][:, :1], slot, interpret=True)
  with pytest.raises(ValueError, match="cos/sin"):
    qkv_rope_cache(x, *weights, cos[:, :8], sin[:, :8], *caches, slot, interpret=True)


@pytest.mark.parametrize("preset", ["qwen2.5-0.5b", "qwen2.5-1.5b"])
def test_lowers_to_triton(preset):
  """The kernel lowers through Pallas' Triton backend for a GPU target (on the CPU: no device needed), as one
  Triton call whose outputs alias the caches (the cache write is in place)."""
  cfg = get_preset(preset)
  b, d, n, kh, h, s = 64, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 2048
  spec = lambda *shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype)
  args = (spec(b, d), spec(d, n, h), spec(d, kh, h), spec(d, kh, h), spec(n, h), spec(kh, h), spec(kh, h),
          spec(b, h // 2, dtype=jnp.float32), spec(b, h // 2, dtype=jnp.float32), spec(b, kh, s, h),
          spec(b, kh, s, h), spec(dtype=jnp.int32))
  text = jax.jit(qkv_rope_cache).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 1
  aliases = re.findall(r"output_operand_alias<output_tuple_indices = \[(\d)\], operand_index = (\d+)", text)
  assert aliases == [("1", "10"), ("2", "11")]  # outputs 1, 2 (k, v caches) are operands 10, 11


def _lowered_grid_and_aliases(*args, **kw):
  text = jax.jit(qkv_rope_cache, static_argnames=("prefetch_splits", "prefetch_blocks")).trace(
      *args, **kw).lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 1
  grid = tuple(int(g) for g in re.findall(r"grid_[xyz] = (\d+)", text))
  return grid, re.findall(r"output_operand_alias<output_tuple_indices = \[(\d)\], operand_index = (\d+)", text)


@pytest.mark.parametrize("splits,blocks,evict", [(2, 2, None), (1, 3, "evict_last"), (4, 1, None)])
def test_prefetch_leaves_the_outputs_unchanged(splits, blocks, evict):
  """The prefetch programs (one per row, KV head and attention split) only load: q and both caches are bitwise
  the same with and without them, and in the Triton call they follow the projection's programs."""
  x, weights, cos, sin, caches, slot = _case(32, 128, 14, 2, 64, 256, jnp.bfloat16, seed=2)
  ranges = SlotRanges(prompt_len_B=jnp.arange(32, dtype=jnp.int32) * 3 + 10, gen_len=jnp.int32(40), gen_start=128)
  pf = dict(prefetch_ranges=ranges, prefetch_splits=splits, prefetch_blocks=blocks)
  base = qkv_rope_cache(x, *weights, cos, sin, *caches, 167, block_m=16, interpret=True)
  got = qkv_rope_cache(x, *weights, cos, sin, *caches, 167, block_m=16, interpret=True, prefetch_evict=evict, **pf)
  for a, b in zip(got, base):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
  args = (x, *weights, cos, sin, *caches, jnp.int32(167))
  grid, aliases = _lowered_grid_and_aliases(*args)
  assert grid == (1, (14 + 2 * 2) * 2, 1)  # 32 rows in one block; 2 programs per 64-wide head
  grid_pf, aliases_pf = _lowered_grid_and_aliases(*args, **pf)
  assert grid_pf == (1, (14 + 2 * 2) * 2 + 32 * 2 * splits, 1)
  assert aliases == aliases_pf == [("1", "10"), ("2", "11")]
  with pytest.raises(ValueError, match="multiples of 64"):
    qkv_rope_cache(x, *weights, cos, sin, caches[0][:, :, :200], caches[1][:, :, :200], 167, interpret=True, **pf)


def test_split_block_is_the_attention_splits_share():
  """split_block against the balanced splits written out: a row's visible blocks (the prompt's, then the generated
  ones from gen_start) in order, shared in runs of ceil(n / splits); past the last, the last."""
  rng = np.random.default_rng(3)
  for _ in range(200):
    bk, gen_start = 64, 64 * int(rng.integers(1, 20))
    plen, glen = int(rng.integers(1, gen_start + 1)), int(rng.integers(1, 500))
    splits = int(rng.choice([1, 2, 3, 4, 8]))
    blocks = list(range(-(-plen // bk))) + [gen_start // bk + j for j in range(-(-glen // bk))]
    per = -(-len(blocks) // splits)
    for s in range(splits):
      for u in range(3):
        want = blocks[min(s * per + u, len(blocks) - 1)]
        assert int(split_block(plen, glen, s, u, splits, bk, gen_start)) == want, (plen, glen, splits, s, u)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,b,block_m,block_w", [("float32", 64, 64, 16), ("bfloat16", 64, 64, 16),
                                                     ("bfloat16", 64, 16, 16), ("bfloat16", 32, 64, 32),
                                                     ("bfloat16", 48, 64, 16)])
def test_triton_kernel_on_gpu(dtype, b, block_m, block_w):
  """Compiled by Triton (not interpret mode) on the Qwen2.5-0.5B attention shape, 2,048 cache slots."""
  try:
    dev = jax.devices("gpu")[0]
  except RuntimeError:
    pytest.skip("JAX sees no GPU (run with JAX_PLATFORMS=cuda,cpu)")
  x, weights, cos, sin, caches, slot = _case(b, 896, 14, 2, 64, 2048, jnp.dtype(dtype))
  with jax.default_device(dev):
    got = qkv_rope_cache(x, *weights, cos, sin, *caches, slot, block_m=block_m, block_w=block_w)
  want = _reference(x, weights, cos, sin, caches, slot)
  if dtype == "float32":
    _check(got, want, 2, 7, rtol=2e-5, atol=2e-5)
  else:
    _check(got, want, 2, 7, rtol=2 ** -8, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("blocks,evict", [(4, None), (4, "evict_last")])
def test_prefetch_on_gpu(blocks, evict):
  """Compiled by Triton with the prefetch programs (0.5B attention shape, B = 64, 2,048 slots, 2 splits): q and
  the caches bitwise as without them."""
  try:
    dev = jax.devices("gpu")[0]
  except RuntimeError:
    pytest.skip("JAX sees no GPU (run with JAX_PLATFORMS=cuda,cpu)")
  x, weights, cos, sin, caches, _ = _case(64, 896, 14, 2, 64, 2048, jnp.bfloat16, seed=4)
  with jax.default_device(dev):
    ranges = SlotRanges(prompt_len_B=jnp.arange(64, dtype=jnp.int32) * 15 + 40, gen_len=jnp.int32(300),
                        gen_start=1024)
    base = qkv_rope_cache(x, *weights, cos, sin, *caches, 1323)
    got = qkv_rope_cache(x, *weights, cos, sin, *caches, 1323, prefetch_ranges=ranges, prefetch_splits=2,
                         prefetch_blocks=blocks, prefetch_evict=evict)
  for a, b in zip(got, base):
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))
  _check(got, _reference(x, weights, cos, sin, caches, 1323), 2, 7, rtol=2 ** -8, atol=1e-5)
