"""The decode MLP kernels (policy/decode/mlp.py: the fused SwiGLU front, the split down projection) against the jnp
expression: in interpret mode on the CPU, and compiled by Triton on the GPU (marker gpu; JAX_PLATFORMS=cuda,cpu)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kevin_jax.policy import get_preset
from kevin_jax.policy.decode import mlp as decode_mlp
from kevin_jax.policy.decode.mlp import (DOWN_SPLITS, down_partials, down_proj, pick_block, pick_splits,
                                        resolve_splits, supported, swiglu_front)


def _case(b, d, f, dtype, seed=0):
  rng = np.random.default_rng(seed)
  x = jnp.asarray(rng.standard_normal((b, d)), dtype)
  wg = jnp.asarray(rng.standard_normal((d, f)) * d ** -0.5, dtype)
  wu = jnp.asarray(rng.standard_normal((d, f)) * d ** -0.5, dtype)
  return x, wg, wu


def _reference(x, wg, wu):
  x, wg, wu = (np.asarray(a, np.float64) for a in (x, wg, wu))
  g = x @ wg
  return g / (1 + np.exp(-g)) * (x @ wu)


@pytest.mark.parametrize("b,d,f,block_m,block_n", [(1, 64, 32, 64, 32), (5, 256, 64, 64, 32), (64, 384, 96, 64, 32),
                                                   (100, 128, 64, 32, 32), (33, 48, 48, 16, 32), (7, 256, 192, 64, 64)])
def test_matches_reference_fp32(b, d, f, block_m, block_n):
  x, wg, wu = _case(b, d, f, jnp.float32)
  got = swiglu_front(x, wg, wu, block_m=block_m, block_n=block_n, interpret=True)
  assert got.shape == (b, f) and got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), _reference(x, wg, wu), rtol=1e-5, atol=1e-5)


def test_bf16_rounds_once():
  x, wg, wu = _case(16, 256, 64, jnp.bfloat16)
  got = np.asarray(swiglu_front(x, wg, wu, interpret=True), np.float32)
  want = _reference(x, wg, wu)
  # One bf16 rounding of the result (8 mantissa bits: relative error <= 2^-8), fp32 accumulation before it.
  np.testing.assert_allclose(got, want, rtol=2 ** -8, atol=1e-6)


def test_front_lowers_to_triton():
  """The front lowers through Pallas' Triton backend for a GPU target on the CPU (0.5B shape, 64 rows): one
  Triton call that takes x and the two weight matrices."""
  spec = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)
  args = (spec(64, 896), spec(896, 4864), spec(896, 4864))
  text = jax.jit(swiglu_front).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  call = [line for line in text.splitlines() if "__gpu$xla.gpu.triton" in line]
  assert len(call) == 1 and call[0].count("tensor<896x4864xbf16>") == 2


def test_front_stages(monkeypatch):
  """4 stages on compute capability >= 9.0 where 3 buffers of the slices fit 227 KB (bf16 64 x 128 x 64: 144 KB;
  fp32: 288 KB do not), else 3."""
  class Dev:
    compute_capability = "9.0"
  monkeypatch.setattr(jax, "devices", lambda *a: [Dev()])
  assert decode_mlp.front_stages(64, 128, 64, 2) == 4 and decode_mlp.front_stages(64, 128, 64, 4) == 3
  Dev.compute_capability = "8.0"
  assert decode_mlp.front_stages(64, 128, 64, 2) == 3
  monkeypatch.setattr(jax, "devices", lambda *a: [object()])  # a CPU device: no compute capability
  assert decode_mlp.front_stages(64, 128, 64, 2) == 3


def test_shape_rules():
  assert [pick_block(d, 128) for d in (896, 1536, 64, 48, 40, 8)] == [128, 128, 64, 16, 0, 0]
  assert [pick_block(f, 32) for f in (4864, 8960, 96, 48, 40)] == [32, 32, 32, 16, 0]
  assert supported(896, 4864) and supported(5120, 27648) and not supported(40, 64) and not supported(896, 100)
  x, wg, wu = _case(4, 40, 64, jnp.float32)
  with pytest.raises(ValueError, match="multiples of 16"):
    swiglu_front(x, wg, wu, interpret=True)
  with pytest.raises(ValueError, match="must both be"):
    swiglu_front(x, wg, wu[:, :32], interpret=True)


def _down_case(b, f, d, dtype, seed=0):
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.standard_normal((b, f)), dtype), jnp.asarray(rng.standard_normal((f, d)) * f ** -0.5, dtype))


@pytest.mark.parametrize("b,f,d,splits,block_n,block_k", [(1, 64, 32, 1, 64, 64), (5, 256, 64, 0, 64, 64),
                                                          (64, 384, 96, 3, 32, 64), (33, 512, 128, 8, 64, 64),
                                                          (100, 256, 48, 2, 64, 128)])
def test_down_proj_matches_reference_fp32(b, f, d, splits, block_n, block_k):
  h, w = _down_case(b, f, d, jnp.float32)
  got = down_proj(h, w, splits=splits, block_n=block_n, block_k=block_k, interpret=True)
  assert got.shape == (b, d) and got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), np.asarray(h, np.float64) @ np.asarray(w, np.float64),
                             rtol=1e-5, atol=1e-5)


def test_down_proj_split_rules():
  # 0.5B (F = 4,864 = 76 x 64): 14 column blocks of 64 need 10 splits for 132 programs; 19 is the first divisor.
  assert pick_splits(4864, 14, 64, 132) == 19 and pick_splits(4864, 7, 128, 132) == 19
  assert pick_splits(8960, 24, 64, 132) == 7  # 1.5B: 140 chunks of 64, 24 x 7 = 168 programs.
  assert pick_splits(192, 4, 64, 132) == 3  # Too few chunks for 132 programs: all of them.
  assert pick_splits(4864, 200, 64, 132) == 1
  assert pick_splits(4864, 14, 64, 66) == 19 and pick_splits(4864, 14, 64, 28) == 2  # fewer SMs
  # The default (None): DOWN_SPLITS where it divides F's chunks (0.5B: 76; small: 24; 1.5B: 140), else pick_splits
  # (the tiny preset's F = 192: 3 chunks); 0 asks for pick_splits; other values stand.
  assert DOWN_SPLITS == 4
  assert resolve_splits(None, 4864, 14, 64) == 4 and resolve_splits(None, 1536, 8, 64) == 4
  assert resolve_splits(None, 192, 1, 64) == 3 and resolve_splits(None, 8960, 24, 64) == 4
  assert resolve_splits(0, 4864, 14, 64, 132) == 19 and resolve_splits(2, 4864, 14, 64) == 2
  h, w = _down_case(4, 256, 64, jnp.float32)
  assert down_partials(h, w, interpret=True).shape == (4, 16, 64)  # 4 chunks of 64: DOWN_SPLITS, 16-row tiles
  with pytest.raises(ValueError, match="must divide"):
    down_proj(h, w, splits=3, interpret=True)  # 256 / 3 is no multiple of 64.
  with pytest.raises(ValueError, match="must be"):
    down_proj(h, w[:128], interpret=True)
  with pytest.raises(ValueError, match="multiples of 16"):
    down_proj(h[:, :40], w[:40], interpret=True)


def _on_gpu(compute):
  """compute() with the first GPU as the default device (skips without one): its inputs and result."""
  try:
    dev = jax.devices("gpu")[0]
  except RuntimeError:
    pytest.skip("JAX sees no GPU (run with JAX_PLATFORMS=cuda,cpu)")
  with jax.default_device(dev):
    return compute()


def _assert_kernel_close(got, want, dtype):
  """fp32: within 2e-5; bf16: one bf16 rounding (2^-8 relative) of an fp32-accumulated result."""
  got = np.asarray(got, np.float32)
  if dtype == "float32":
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
  else:
    np.testing.assert_allclose(got, want, rtol=2 ** -8, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,b,block_n", [("float32", 64, 32), ("bfloat16", 64, 32), ("bfloat16", 256, 32),
                                             ("bfloat16", 24, 32), ("float32", 64, 64), ("bfloat16", 64, 64)])
def test_triton_kernel_on_gpu(dtype, b, block_n):
  """Compiled by Triton (not interpret mode) on the Qwen2.5-0.5B MLP shape."""
  def compute():
    x, wg, wu = _case(b, 896, 4864, jnp.dtype(dtype))
    return (x, wg, wu), swiglu_front(x, wg, wu, block_n=block_n)
  inputs, got = _on_gpu(compute)
  _assert_kernel_close(got, _reference(*inputs), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,b,splits", [("float32", 64, None), ("bfloat16", 64, None), ("bfloat16", 64, 0),
                                            ("bfloat16", 256, 0), ("bfloat16", 24, 4), ("bfloat16", 64, 1)])
def test_down_proj_triton_on_gpu(dtype, b, splits):
  """The split down projection compiled by Triton on the Qwen2.5-0.5B shape ([B, 4864] x [4864, 896]); splits None
  is the default (DOWN_SPLITS), 0 pick_splits' 19."""
  def compute():
    h, w = _down_case(b, 4864, 896, jnp.dtype(dtype))
    return (h, w), down_proj(h, w, splits=splits)
  (h, w), got = _on_gpu(compute)
  _assert_kernel_close(got, np.asarray(h, np.float64) @ np.asarray(w, np.float64), dtype)
