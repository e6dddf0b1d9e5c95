"""DecodeConfig.norm 'fold' and 'inside': the decode step's RMSNorms applied inside the q/k/v and SwiGLU
kernels as 1/rms on their products, the norm's scale folded into a copy of their weights (decode/step.py:
fold). 1/rms comes from XLA ('fold': step.inv_rms, the kernels' `inv_rms_B`) or from the kernels ('inside':
`rms_eps`). Against the normed input in interpret mode on the CPU, lowered to Triton for a GPU target (on the CPU),
and compiled by Triton on the GPU (marker gpu; JAX_PLATFORMS=cuda,cpu); the sampler end to end with them:
tests/test_policy_decode_step.py."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kevin_jax.policy import get_preset
from kevin_jax.policy.decode.mlp import swiglu_front
from kevin_jax.policy.decode.qkv import qkv_rope_cache
from kevin_jax.policy.decode import step as step_lib
from kevin_jax.policy.model import RMSNorm
from tests import test_policy_decode_qkv as qkv_tests


def _norm(d, seed=0, dtype="float32"):
  """An RMSNorm of width d with a random scale (around 1: a wrong fold shows) and eps 1e-6."""
  cfg = get_preset("tiny", hidden_size=d, param_dtype=dtype)
  norm = RMSNorm(cfg, rngs=nnx.Rngs(0))
  norm.scale[...] = jnp.asarray(np.random.default_rng(seed).normal(1.0, 0.3, d), norm.scale[...].dtype)
  return norm


def _reference_norm(x, scale, eps=1e-6):
  x = np.asarray(x, np.float64)
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * np.asarray(scale, np.float64)


def test_inv_rms_and_fold():
  """inv_rms(x) * (x @ fold(w)) equals norm(x) @ w (float64 reference), and inv_rms is fp32 [B]."""
  rng = np.random.default_rng(1)
  norm = _norm(64)
  x = jnp.asarray(rng.standard_normal((5, 64)) * 3, jnp.float32)
  w = jnp.asarray(rng.standard_normal((64, 3, 8)), jnp.float32)
  r = step_lib.inv_rms(norm, x)
  assert r.shape == (5,) and r.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(r), 1 / np.sqrt(np.mean(np.asarray(x, np.float64) ** 2, -1) + 1e-6),
                             rtol=1e-6)
  got = np.asarray(r)[:, None, None] * np.einsum("bd,dnh->bnh", np.asarray(x), np.asarray(step_lib.fold(norm, w).astype(jnp.float32)))
  want = np.einsum("bd,dnh->bnh", _reference_norm(x, norm.scale[...]), np.asarray(w, np.float64))
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  assert step_lib.fold(norm, w).astype(jnp.bfloat16).dtype == jnp.bfloat16


def _rms_args(mode, norm, x):
  """The kernels' (inv_rms_B, rms_eps) for decode_norm `mode`."""
  return (step_lib.inv_rms(norm, x), None) if mode == "fold" else (None, norm.eps)


@pytest.mark.parametrize("mode", ["fold", "inside"])
@pytest.mark.parametrize("b,d,n,kh,h,block_m", [(16, 64, 4, 2, 32, 64), (32, 128, 14, 2, 64, 16)])
def test_qkv_fold_matches_normed_input_fp32(b, d, n, kh, h, block_m, mode):
  """The q/k/v kernel on the raw x with folded weights and 1/rms (given, or its own) equals it on the normed x
  (float64 reference of the normed x, interpret mode, fp32)."""
  x, weights, cos, sin, caches, slot = qkv_tests._case(b, d, n, kh, h, 40, jnp.float32)  # pylint: disable=protected-access
  norm = _norm(d, seed=2)
  folded = [step_lib.fold(norm, w).astype(jnp.float32) for w in weights[:3]]
  r, eps = _rms_args(mode, norm, x)
  got = qkv_rope_cache(x, *folded, *weights[3:], cos, sin, *caches, slot, r, rms_eps=eps, block_m=block_m,
                       interpret=True)
  want = qkv_tests._reference(_reference_norm(x, norm.scale[...]), weights, cos, sin, caches, slot)  # pylint: disable=protected-access
  qkv_tests._check(got, want, kh, n // kh, rtol=1e-5, atol=1e-5)  # pylint: disable=protected-access


@pytest.mark.parametrize("mode", ["fold", "inside"])
@pytest.mark.parametrize("b", [16, 5])
def test_swiglu_fold_matches_normed_input_fp32(b, mode):
  """The SwiGLU front on the raw x (padded rows too: b = 5) with folded weights and 1/rms (given, or its own)."""
  rng = np.random.default_rng(3)
  d, f = 128, 96
  x = jnp.asarray(rng.standard_normal((b, d)) * 3, jnp.float32)
  wg, wu = (jnp.asarray(rng.standard_normal((d, f)) * d ** -0.5, jnp.float32) for _ in range(2))
  norm = _norm(d, seed=4)
  r, eps = _rms_args(mode, norm, x)
  got = swiglu_front(x, step_lib.fold(norm, wg).astype(jnp.float32), step_lib.fold(norm, wu).astype(jnp.float32), r, rms_eps=eps, block_n=32,
                     interpret=True)
  xn = _reference_norm(x, norm.scale[...])
  g = xn @ np.asarray(wg, np.float64)
  np.testing.assert_allclose(np.asarray(got), g / (1 + np.exp(-g)) * (xn @ np.asarray(wu, np.float64)),
                             rtol=1e-5, atol=1e-5)


def test_inv_rms_shape_is_checked():
  x, weights, cos, sin, caches, slot = qkv_tests._case(16, 64, 4, 2, 32, 16, jnp.float32)  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="inv_rms_B"):
    qkv_rope_cache(x, *weights, cos, sin, *caches, slot, jnp.ones((8,)), interpret=True)
  with pytest.raises(ValueError, match="inv_rms_B"):
    swiglu_front(x, weights[0].reshape(64, -1), weights[0].reshape(64, -1), jnp.ones((8,)), interpret=True)
  with pytest.raises(ValueError, match="not both"):
    qkv_rope_cache(x, *weights, cos, sin, *caches, slot, jnp.ones((16,)), rms_eps=1e-6, interpret=True)
  with pytest.raises(ValueError, match="not both"):
    swiglu_front(x, weights[0].reshape(64, -1), weights[0].reshape(64, -1), jnp.ones((16,)), rms_eps=1e-6,
                 interpret=True)


@pytest.mark.parametrize("mode", ["fold", "inside"])
def test_fold_lowers_to_triton(mode):
  """Both kernels with 1/rms given or their own lower through Pallas' Triton backend for a GPU target (0.5B shape,
  64 rows), the q/k/v kernel's cache outputs still aliased (operands 11 and 12 with inv_rms_B)."""
  b, d, n, kh, h, s, f = 64, 896, 14, 2, 64, 2048, 4864
  spec = lambda *shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype)
  r = [spec(b, dtype=jnp.float32)] if mode == "fold" else []
  eps = None if mode == "fold" else 1e-6
  text = jax.jit(functools.partial(swiglu_front, rms_eps=eps)).trace(spec(b, d), spec(d, f), spec(d, f), *r).lower(
      lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 1
  args = (spec(b, d), spec(d, n, h), spec(d, kh, h), spec(d, kh, h), spec(n, h), spec(kh, h), spec(kh, h),
          spec(b, h // 2, dtype=jnp.float32), spec(b, h // 2, dtype=jnp.float32), spec(b, kh, s, h),
          spec(b, kh, s, h), spec(dtype=jnp.int32), *r)
  text = jax.jit(functools.partial(qkv_rope_cache, rms_eps=eps)).trace(*args).lower(
      lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 1
  first = 10 + len(r)
  assert f"output_tuple_indices = [1], operand_index = {first}" in text
  assert f"output_tuple_indices = [2], operand_index = {first + 1}" in text


def _max_err(got, want):
  return max(float(np.max(np.abs(np.asarray(g, np.float64) - w))) for g, w in zip(got, want))


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fold", "inside"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fold_kernels_on_gpu(dtype, mode):
  """Both kernels compiled by Triton with 1/rms given or their own at the 0.5B shape (64 rows), against the
  float64 reference of the normed input: fp32 within 2e-5; bf16 no more than 1.5x the error of the same kernel
  on XLA's bf16-rounded normed input (the weights' one rounding after the fold against the normed x's)."""
  try:
    dev = jax.devices("gpu")[0]
  except RuntimeError:
    pytest.skip("JAX sees no GPU (run with JAX_PLATFORMS=cuda,cpu)")
  dt = jnp.dtype(dtype)
  with jax.default_device(dev):
    x, weights, cos, sin, caches, slot = qkv_tests._case(64, 896, 14, 2, 64, 2048, dt)  # pylint: disable=protected-access
    norm = _norm(896, seed=6, dtype="float32")
    xn = _reference_norm(x, norm.scale[...])
    folded = [step_lib.fold(norm, w).astype(dt) for w in weights[:3]]
    r, eps = _rms_args(mode, norm, x)
    got = qkv_rope_cache(x, *folded, *weights[3:], cos, sin, *caches, slot, r, rms_eps=eps)
    base = qkv_rope_cache(jnp.asarray(xn, dt), *weights, cos, sin, *caches, slot)
    rng = np.random.default_rng(7)
    wg, wu = (jnp.asarray(rng.standard_normal((896, 4864)) * 896 ** -0.5, dt) for _ in range(2))
    front = swiglu_front(x, step_lib.fold(norm, wg).astype(dt), step_lib.fold(norm, wu).astype(dt), r, rms_eps=eps)
    front_base = swiglu_front(jnp.asarray(xn, dt), wg, wu)
  want = qkv_tests._reference(xn, weights, cos, sin, caches, slot)  # pylint: disable=protected-access
  g = xn @ np.asarray(wg, np.float64)
  want_front = g / (1 + np.exp(-g)) * (xn @ np.asarray(wu, np.float64))
  if dtype == "float32":
    qkv_tests._check(got, want, 2, 7, rtol=2e-5, atol=2e-5)  # pylint: disable=protected-access
    np.testing.assert_allclose(np.asarray(front, np.float64), want_front, rtol=2e-5, atol=2e-5)
  else:
    q = np.asarray(got[0], np.float64)
    assert not np.any(q[:, :, 7:])  # decode_attention's padding rows are zero
    wq = [want[0].reshape(64, 2, 7, 64), want[1], want[2]]
    crop = lambda t: [np.asarray(t[0])[:, :, :7], t[1], t[2]]
    err, err_base = _max_err(crop(got), wq), _max_err(crop(base), wq)
    assert 0 < err <= 1.5 * err_base, (err, err_base)
    err, err_base = _max_err([front], [want_front]), _max_err([front_base], [want_front])
    assert 0 < err <= 1.5 * err_base, (err, err_base)
