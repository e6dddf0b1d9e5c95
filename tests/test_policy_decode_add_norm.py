"""The residual add + next RMSNorm of a decode step (policy/decode_add_norm.py, ModelConfig.decode_add_norm) against
a float64 reference and the model's XLA expression: in interpret mode on the CPU, lowered to Triton IR on the CPU,
compiled by Triton on the GPU (marker gpu); and the sampler end to end with it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax import nnx

from kevin_jax.policy import get_preset
from kevin_jax.policy.decode_add_norm import add_norm, supported
from kevin_jax.policy.model import RMSNorm
from tests.test_common import assert_sampler_same_with_kernel

EPS = 1e-6


def _case(b, d, splits, rows, dtype, y_dtype=jnp.float32, seed=0):
  rng = np.random.default_rng(seed)
  h = jnp.asarray(rng.standard_normal((b, d)) * 3, dtype)
  y = jnp.asarray(rng.standard_normal((splits, rows, d)), y_dtype)
  scale = jnp.asarray(rng.uniform(0.5, 2.0, d), dtype)
  return h, y, scale


def _reference(h, y, scale):
  """float64: h + sum of y's first B rows, and its RMSNorm."""
  h, y, scale = (np.asarray(a, np.float64) for a in (h, y, scale))
  hn = h + y[:, :h.shape[0]].sum(0)
  return hn, hn / np.sqrt(np.mean(hn * hn, axis=1, keepdims=True) + EPS) * scale


def _xla_path(h, y, scale):
  """The model's XLA path in h's dtype: down_proj's rounded sum, the residual add, the model's RMSNorm (fp32)."""
  norm = RMSNorm(get_preset("tiny", hidden_size=h.shape[1], rms_norm_eps=EPS, param_dtype=str(scale.dtype)),
                 rngs=nnx.Rngs(0))
  norm.scale[...] = scale
  hn = h + y.astype(jnp.float32).sum(0)[:h.shape[0]].astype(h.dtype)
  return hn, norm(hn)


@pytest.mark.parametrize("b,d,splits,rows,block_m,block_d", [(64, 896, 19, 64, 1, 128), (5, 96, 3, 16, 1, 32),
                                                             (24, 256, 1, 24, 4, 128), (12, 48, 4, 16, 8, 128),
                                                             (1, 64, 2, 16, 1, 64), (6, 64, 2, 8, 3, 64)])
def test_matches_reference_fp32(b, d, splits, rows, block_m, block_d):
  """Rows past B in y (a kernel's padding: here 16 for B = 5 and 12) are ignored; block_m 8 with B = 12 takes rows
  4 at a time, block_m 3 with B = 6 two at a time; block_d 128 for D = 48 halves to 16."""
  h, y, scale = _case(b, d, splits, rows, jnp.float32)
  y = y.at[:, b:].set(1e6)  # must not be read
  got_h, got_x = add_norm(h, y, scale, EPS, block_m=block_m, block_d=block_d, interpret=True)
  assert got_h.shape == got_x.shape == (b, d) and got_h.dtype == got_x.dtype == jnp.float32
  want_h, want_x = _reference(h, y, scale)
  np.testing.assert_allclose(np.asarray(got_h), want_h, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(got_x), want_x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("splits,y_dtype", [(1, jnp.bfloat16), (19, jnp.float32)])
def test_bf16_same_roundings_as_the_xla_path(splits, y_dtype):
  """In bf16 the new residual is the XLA path's bit for bit when there is nothing to sum in another order (S = 1,
  the einsum's output), and within one bf16 rounding otherwise; the normed output within one bf16 rounding."""
  h, y, scale = _case(64, 896, splits, 64, jnp.bfloat16, y_dtype, seed=1)
  got_h, got_x = (np.asarray(a, np.float32) for a in add_norm(h, y, scale, EPS, interpret=True))
  want_h, want_x = (np.asarray(a, np.float32) for a in _xla_path(h, y, scale))
  if splits == 1:
    np.testing.assert_array_equal(got_h, want_h)
  else:
    np.testing.assert_allclose(got_h, want_h, rtol=2 ** -8, atol=1e-6)
  np.testing.assert_allclose(got_x, want_x, rtol=2 ** -7, atol=1e-6)
  assert np.mean(got_x == want_x) > 0.95  # mostly identical: only the fp32 sums' order differs


@pytest.mark.parametrize("splits,y_dtype", [(19, jnp.float32), (1, jnp.bfloat16)])
def test_lowers_to_triton(splits, y_dtype):
  """One Triton call at the 0.5B shape, B = 64: 19 fp32 partials (down_proj's split at 64 rows) or the einsum's
  bf16 output."""
  spec = lambda *shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype)
  fn = lambda h, y, s: add_norm(h, y, s, EPS)
  text = jax.jit(fn).trace(spec(64, 896), spec(splits, 64, 896, dtype=y_dtype), spec(896)).lower(
      lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 1


def test_shape_rules():
  assert supported(896) and supported(48) and not supported(40)
  h, y, scale = _case(4, 40, 1, 4, jnp.float32)
  with pytest.raises(ValueError, match="multiple of 16"):
    add_norm(h, y, scale, EPS, interpret=True)
  h, y, scale = _case(8, 64, 2, 4, jnp.float32)
  with pytest.raises(ValueError, match=r"R >= B=8"):
    add_norm(h, y, scale, EPS, interpret=True)
  with pytest.raises(ValueError, match="norm scale"):
    add_norm(h, jnp.zeros((2, 8, 64)), scale[:32], EPS, interpret=True)


def test_sampler_same_tokens_with_the_kernel():
  """decode_add_norm alone (interpret; the down projection XLA's, so y is its output)."""
  assert_sampler_same_with_kernel("decode_add_norm", max_new_tokens=30)


def test_sampler_same_tokens_with_every_decode_kernel():
  """decode_add_norm summing the Pallas down projection's partials, with every other decode kernel (interpret),
  16 rows, against decode_add_norm 'xla' with the same kernels."""
  assert_sampler_same_with_kernel("decode_add_norm", max_new_tokens=20, batch_size=16, head_dim=32,
                                  decode_attention="interpret", decode_mlp="interpret", decode_down="interpret",
                                  decode_qkv="interpret", decode_out="interpret")


def test_config_values():
  assert get_preset("tiny").decode_add_norm == "xla"  # opt-in: slower end to end (BENCHMARKS.md Sampler)
  with pytest.raises(ValueError, match="decode_add_norm"):
    get_preset("tiny", decode_add_norm="triton")
  with pytest.raises(ValueError, match="fp32_upcast"):
    get_preset("tiny", decode_add_norm="pallas", fp32_upcast=False)


@pytest.mark.parametrize("backend,upcast,want", [("cpu", True, "xla"), ("gpu", True, "pallas"),
                                                 ("gpu", False, "xla")])
def test_auto_resolution(monkeypatch, backend, upcast, want):
  """'auto': the kernel on a GPU when the norm runs in fp32 (fp32_upcast), else XLA's fusions."""
  from kevin_jax.policy import model as model_lib  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(model_lib.jax, "default_backend", lambda: backend)
  cfg = get_preset("tiny", decode_add_norm="auto", fp32_upcast=upcast)
  assert model_lib._decode_add_norm_impl(cfg) == want  # pylint: disable=protected-access


@pytest.mark.gpu
@pytest.mark.parametrize("splits,y_dtype,block_m", [(19, jnp.float32, 1), (4, jnp.float32, 2),
                                                    (1, jnp.bfloat16, 1)])
def test_triton_kernel_on_gpu(splits, y_dtype, block_m):
  """Compiled by Triton on the Qwen2.5-0.5B shape (B = 64, D = 896), bf16: within one bf16 rounding of the
  model's XLA path."""
  try:
    dev = jax.devices("gpu")[0]
  except RuntimeError:
    pytest.skip("JAX sees no GPU (run with JAX_PLATFORMS=cuda,cpu)")
  h, y, scale = _case(64, 896, splits, 64, jnp.bfloat16, y_dtype, seed=2)
  with jax.default_device(dev):
    h, y, scale = (jax.device_put(a, dev) for a in (h, y, scale))
    got_h, got_x = (np.asarray(a, np.float32) for a in add_norm(h, y, scale, EPS, block_m=block_m))
    want_h, want_x = (np.asarray(a, np.float32) for a in jax.jit(_xla_path)(h, y, scale))
  np.testing.assert_allclose(got_h, want_h, rtol=2 ** -8, atol=1e-6)
  np.testing.assert_allclose(got_x, want_x, rtol=2 ** -7, atol=1e-6)
