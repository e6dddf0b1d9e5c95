"""The decode step's output projection with the residual add (policy/decode/oproj.py, DecodeConfig.out) against
a float64 reference: in interpret mode on the CPU, lowered to Triton IR for the GPU on the CPU, compiled by Triton
on the GPU (marker gpu). The sampler end to end with it: tests/test_policy_decode_step.py."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kevin_jax.policy import get_preset
from kevin_jax.policy.decode.oproj import out_proj_residual, supported


def _case(b, n, hd, d, dtype, seed=0):
  rng = np.random.default_rng(seed)
  arr = lambda *shape, scale=1.0: jnp.asarray(rng.standard_normal(shape) * scale, dtype)
  return arr(b, n, hd), arr(n, hd, d, scale=(n * hd) ** -0.5), arr(b, d, scale=4.0)


def _reference(o, w, h):
  o, w, h = (np.asarray(a, np.float64) for a in (o, w, h))
  return h + np.einsum("bnh,nhd->bd", o, w)


@pytest.mark.parametrize("b,n,hd,d,block_m,block_n", [(64, 14, 64, 128, 64, 16), (5, 4, 32, 64, 64, 16),
                                                      (48, 6, 128, 96, 16, 32), (100, 8, 16, 48, 64, 16)])
def test_matches_reference_fp32(b, n, hd, d, block_m, block_n):
  o, w, h = _case(b, n, hd, d, jnp.float32)
  got = out_proj_residual(o, w, h, block_m=block_m, block_n=block_n, interpret=True)
  assert got.shape == (b, d) and got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), _reference(o, w, h), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("b,kh,groups,padded,hd,d", [(64, 2, 7, 16, 64, 128), (5, 3, 2, 16, 32, 64),
                                                     (16, 1, 16, 16, 16, 48)])
def test_padded_heads_match_reference_fp32(b, kh, groups, padded, hd, d):
  """o in decode_attention's padded layout [B, K, G_pad, H]: only the real heads count (the padding rows hold
  large values that would show if read)."""
  o, w, h = _case(b, kh * groups, hd, d, jnp.float32, seed=2)
  pad = jnp.full((b, kh, padded - groups, hd), 1e4, jnp.float32)
  o_pad = jnp.concatenate([o.reshape(b, kh, groups, hd), pad], axis=2)
  got = out_proj_residual(o_pad, w, h, groups=groups, interpret=True)
  np.testing.assert_allclose(np.asarray(got), _reference(o, w, h), rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="w_o must be"):
    out_proj_residual(o_pad, w[:-1], h, groups=groups, interpret=True)


def test_bf16_rounds_once():
  o, w, h = _case(16, 14, 64, 256, jnp.bfloat16, seed=1)
  got = np.asarray(out_proj_residual(o, w, h, interpret=True), np.float64)
  want = _reference(o, w, h)
  np.testing.assert_allclose(got, want, rtol=2 ** -8, atol=1e-6)  # fp32 sum, then one bf16 rounding
  # The XLA path rounds o @ w to bf16 before the add: two roundings, never closer than one here.
  xla = np.asarray(h + jnp.einsum("bnh,nhd->bd", o, w), np.float64)
  assert 0 < np.max(np.abs(got - want)) <= np.max(np.abs(xla - want))


def test_shape_rules():
  assert supported(896, 896) and supported(5120, 5120) and not supported(40, 896) and not supported(896, 40)
  o, w, h = _case(4, 2, 20, 64, jnp.float32)
  with pytest.raises(ValueError, match="multiples of 16"):
    out_proj_residual(o, w, h, interpret=True)
  o, w, h = _case(4, 2, 32, 64, jnp.float32)
  with pytest.raises(ValueError, match="residual must be"):
    out_proj_residual(o, w, h[:, :32], interpret=True)
  with pytest.raises(ValueError, match="w_o must be"):
    out_proj_residual(o, w[:1], h, interpret=True)


def test_lowers_to_triton():
  """Lowers through Pallas' Triton backend for a GPU target on the CPU (the 0.5B shape, 64 rows)."""
  b, n, hd, d = 64, 14, 64, 896
  args = (jax.ShapeDtypeStruct((b, n, hd), jnp.bfloat16), jax.ShapeDtypeStruct((n, hd, d), jnp.bfloat16),
          jax.ShapeDtypeStruct((b, d), jnp.bfloat16))
  text = jax.jit(out_proj_residual).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 1
  padded = jax.ShapeDtypeStruct((b, 2, 16, hd), jnp.bfloat16)  # decode_attention's layout, 7 real heads per KV head
  fn = functools.partial(out_proj_residual, groups=7)
  text = jax.jit(fn).trace(padded, *args[1:]).lower(lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,b,block_n", [("float32", 64, 16), ("bfloat16", 64, 16), ("bfloat16", 64, 32),
                                             ("bfloat16", 24, 16)])
def test_triton_kernel_on_gpu(dtype, b, block_n):
  """Compiled by Triton on the Qwen2.5-0.5B shape ([B, 14 x 64] x [896, 896] + [B, 896])."""
  try:
    dev = jax.devices("gpu")[0]
  except RuntimeError:
    pytest.skip("JAX sees no GPU (run with JAX_PLATFORMS=cuda,cpu)")
  o, w, h = _case(b, 14, 64, 896, jnp.dtype(dtype))
  with jax.default_device(dev):
    got = np.asarray(out_proj_residual(o, w, h, block_n=block_n), np.float64)
  tol = dict(rtol=2e-5, atol=2e-5) if dtype == "float32" else dict(rtol=2 ** -8, atol=1e-5)
  np.testing.assert_allclose(got, _reference(o, w, h), **tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_padded_heads_triton_kernel_on_gpu(dtype):
  """decode_attention's padded layout [B, K=2, 16, H] with G = 7 real heads (the 0.5B shape), compiled by Triton:
  the padding rows (large values) are skipped."""
  try:
    dev = jax.devices("gpu")[0]
  except RuntimeError:
    pytest.skip("JAX sees no GPU (run with JAX_PLATFORMS=cuda,cpu)")
  o, w, h = _case(64, 14, 64, 896, jnp.dtype(dtype), seed=3)
  o_pad = jnp.concatenate([o.reshape(64, 2, 7, 64), jnp.full((64, 2, 9, 64), 1e4, o.dtype)], axis=2)
  with jax.default_device(dev):
    got = np.asarray(out_proj_residual(o_pad, w, h, groups=7), np.float64)
  tol = dict(rtol=2e-5, atol=2e-5) if dtype == "float32" else dict(rtol=2 ** -8, atol=1e-5)
  np.testing.assert_allclose(got, _reference(o, w, h), **tol)
