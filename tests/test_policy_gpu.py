"""Policy on a GPU (run on the GPU host): JAX_PLATFORMS=cuda,cpu python -m pytest -q -m gpu tests/test_policy_gpu.py

- attention_impl='cudnn' (flash kernel) agrees with the einsum path in bf16, forward and gradients;
- the bf16 sampler on the GPU decodes what a float32 reference forward pass predicts;
- the GPU sampler's greedy tokens equal transformers' generate on the same (float32) checkpoint;
  both sampler tests run with the decode step's down projection as XLA's einsum and as the split Pallas kernel
  (DecodeConfig.down).
- the Pallas decode-attention kernel, compiled by Triton, equals the masked einsum (fp32 and bf16 caches; split
  or not);
- the fused decode q/k/v kernel (DecodeConfig.qkv) and the o projection kernel on the one-split attention's
  padded output (DecodeConfig.out) in the sampler: the XLA path's greedy tokens in fp32, a float32 forward pass's
  log-probs in bf16 (tests/test_policy_decode_step.py compares every plan in fp32).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kevin_jax.policy import Qwen2, get_preset, load_pretrained
from kevin_jax.policy.decode.plan import DecodeConfig
from kevin_jax.policy.sampler import Sampler, SamplerConfig
from tests.test_common import make_hf_qwen2

pytestmark = pytest.mark.gpu


def _gpu():
  try:
    return jax.devices("gpu")[0]
  except RuntimeError:
    pytest.skip("JAX sees no GPU (run with JAX_PLATFORMS=cuda,cpu)")


def test_cudnn_attention_matches_xla_bf16():
  dev = _gpu()
  cfg = get_preset("tiny", vocab_size=512, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=64,
                   num_layers=2)
  with jax.default_device(dev):
    xla = Qwen2(cfg, rngs=nnx.Rngs(0))
    cudnn = Qwen2(cfg.replace(attention_impl="cudnn"), rngs=nnx.Rngs(0))
    b, t = 4, 256
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, 512, (b, t)))
    lengths = np.array([256, 200, 17, 128])
    mask = jnp.asarray(np.arange(t)[None] < lengths[:, None])
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))

    # A fixed random projection of the final-normed states: sum(h**2) would be ~constant after the RMS norm,
    # leaving only rounding noise as gradients to compare.
    r = jnp.asarray(np.random.RandomState(1).randn(b, t, cfg.hidden_size), jnp.float32)

    def loss(m):
      h = m.hidden(tokens, positions, mask)[0]
      return jnp.sum(jnp.where(mask[..., None], h.astype(jnp.float32) * r, 0.0)) / 1e3, h

    (l_x, h_x), g_x = nnx.value_and_grad(loss, has_aux=True)(xla)
    (l_c, h_c), g_c = nnx.value_and_grad(loss, has_aux=True)(cudnn)
  m = np.asarray(mask)
  hx, hc = np.asarray(h_x, np.float32)[m], np.asarray(h_c, np.float32)[m]
  assert np.max(np.abs(hx - hc)) / np.max(np.abs(hx)) < 3e-2  # bf16 rounding only
  for (path, a), c in zip(jax.tree_util.tree_leaves_with_path(g_x), jax.tree.leaves(g_c)):
    a, c = np.asarray(a, np.float32), np.asarray(c, np.float32)
    assert np.linalg.norm(a - c) <= 5e-2 * np.linalg.norm(a) + 1e-6, jax.tree_util.keystr(path)


@pytest.mark.parametrize("decode_down", ["xla", "pallas"])
def test_bf16_sampler_on_gpu_matches_fp32_forward(tmp_path, decode_down):
  dev = _gpu()
  make_hf_qwen2(tmp_path, tie=True, num_heads=4, num_kv_heads=2, hidden_size=128, vocab_size=512)
  with jax.default_device(dev):
    model = load_pretrained(tmp_path, dtype="bfloat16", compute_dtype="bfloat16")
    ref = load_pretrained(tmp_path, dtype="float32", compute_dtype="float32")
    prompts = [list(range(3, 3 + n)) for n in (5, 40, 17)]
    sampler = Sampler(model.cfg, None, SamplerConfig(batch_size=4, prompt_buckets=(64,),
                                                  decode=DecodeConfig(down=decode_down)))
    out = sampler.generate(model, prompts, seed=0, temperature=1.0, max_new_tokens=32)
    with jax.default_matmul_precision("highest"):
      for p, toks, lp in zip(prompts, out.tokens, out.logprobs):
        seq = jnp.asarray([p + toks])
        logits, _ = ref(seq, jnp.arange(seq.shape[1])[None])
        logp = jax.nn.log_softmax(logits[0], axis=-1)
        fresh = np.asarray(logp[np.arange(len(p) - 1, len(p) - 1 + len(toks)), toks])
        assert np.max(np.abs(fresh - lp)) < 0.15  # bf16 weights + bf16 cache vs fp32
        assert np.mean(np.abs(fresh - lp)) < 0.03


@pytest.mark.parametrize("decode_down", ["xla", "pallas"])
def test_greedy_on_gpu_equals_transformers(tmp_path, decode_down):
  import torch  # pylint: disable=g-import-not-at-top
  dev = _gpu()
  hf = make_hf_qwen2(tmp_path, tie=False, num_heads=4, num_kv_heads=2, hidden_size=64, vocab_size=256)
  prompts = [list(np.random.RandomState(n).randint(0, 256, n)) for n in (5, 11, 3, 8)]
  with jax.default_device(dev), jax.default_matmul_precision("highest"):
    model = load_pretrained(tmp_path, dtype="float32", compute_dtype="float32")
    cfg = SamplerConfig(batch_size=4, prompt_buckets=(16,), kv_cache_dtype="float32",
                        decode=DecodeConfig(down=decode_down))
    out = Sampler(model.cfg, None, cfg).generate(model, prompts, seed=0, temperature=0.0, max_new_tokens=64)
  for p, toks in zip(prompts, out.tokens):
    with torch.no_grad():
      ref = hf.generate(torch.tensor([p]), max_new_tokens=64, min_new_tokens=64, do_sample=False,
                        eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
    assert toks == ref


@pytest.mark.parametrize("balance,splits", [(False, 0), (True, 0), (False, 1)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_pallas_decode_attention_matches_einsum_on_gpu(dtype, balance, splits):
  """The Triton-compiled kernel (not interpret mode) on a Qwen2.5-0.5B-shaped cache with ragged prompts, its
  splits over fixed slot ranges or balanced over each row's visible blocks; and one split,
  which writes its output itself."""
  from kevin_jax.policy.decode.attention import SlotRanges, decode_attention  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy.model import decode_attend  # pylint: disable=g-import-not-at-top
  dev = _gpu()
  b, k, g, h, p, n = 16, 2, 7, 64, 1024, 1024
  rng = np.random.default_rng(0)
  with jax.default_device(dev):
    q = jnp.asarray(rng.standard_normal((b, k, g, h)), dtype)
    kc = jnp.asarray(rng.standard_normal((b, k, p + n, h)), dtype)
    vc = jnp.asarray(rng.standard_normal((b, k, p + n, h)), dtype)
    ranges = SlotRanges(prompt_len_B=jnp.asarray(rng.integers(1, p + 1, b), jnp.int32), gen_len=jnp.int32(333),
                        gen_start=p)
    got = np.asarray(decode_attention(q, kc, vc, ranges, balance=balance, num_splits=splits),
                     np.float32)
    with jax.default_matmul_precision("highest"):
      want = np.asarray(decode_attend(q.astype(jnp.float32), kc.astype(jnp.float32), vc.astype(jnp.float32),
                                       ranges.mask(p + n), True), np.float32)
  tol = 2e-5 if dtype == "float32" else 2e-2
  np.testing.assert_allclose(got, want, atol=tol, rtol=tol)


@pytest.mark.parametrize("field", ["qkv", "out"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_kernel_sampler_on_gpu(tmp_path, monkeypatch, dtype, field):
  """DecodeConfig.<field>='pallas' against 'xla', compiled by Triton, with the Pallas decode attention, 16 rows (the
  q/k/v kernel's smallest batch): qkv (the fused q/k/v projection, RoPE and cache write), out (the o projection
  + residual kernel; q/k/v 'auto'; the attention in one split (a device of 8 SMs), so the kernel reads its padded
  output). The greedy tokens of the XLA path in fp32; in bf16 the log-probs of a float32 forward pass, as
  test_bf16_sampler_on_gpu_matches_fp32_forward."""
  from kevin_jax.policy.decode import plan as plan_lib  # pylint: disable=g-import-not-at-top
  dev = _gpu()
  if field == "out":
    monkeypatch.setattr(plan_lib.DeviceInfo, "current", classmethod(lambda cls: plan_lib.DeviceInfo("gpu", 8)))
  make_hf_qwen2(tmp_path, tie=True, num_heads=4, num_kv_heads=2, hidden_size=128, vocab_size=512)  # head_dim 32
  prompts = [list(np.random.RandomState(n).randint(0, 512, n)) for n in range(3, 19)]
  outs = {}
  with jax.default_device(dev), jax.default_matmul_precision("highest" if dtype == "float32" else "default"):
    for impl in ("xla", "pallas"):
      model = load_pretrained(tmp_path, dtype=dtype, compute_dtype=dtype)
      cfg = SamplerConfig(batch_size=16, prompt_buckets=(64,), kv_cache_dtype=dtype,
                          decode=DecodeConfig(attention="pallas", **{field: impl}))
      outs[impl] = Sampler(model.cfg, None, cfg).generate(model, prompts, seed=0, temperature=0.0,
                                                          max_new_tokens=48, eos_ids=[])
    if dtype == "float32":
      assert outs["pallas"].tokens == outs["xla"].tokens
      for a, b in zip(outs["pallas"].logprobs, outs["xla"].logprobs):
        np.testing.assert_allclose(a, b, atol=1e-4)
      return
    ref = load_pretrained(tmp_path, dtype="float32", compute_dtype="float32")
    # One forward pass of all rows, right-padded to one length (causal: the padding changes no earlier logit), so
    # it compiles once; sixteen lengths compiled one by one took over 100 s.
    seqs = [p + toks for p, toks in zip(prompts, outs["pallas"].tokens)]
    width = max(map(len, seqs))
    batch = jnp.asarray([s + [0] * (width - len(s)) for s in seqs])
    with jax.default_matmul_precision("highest"):
      logp = np.asarray(jax.nn.log_softmax(ref(batch, jnp.broadcast_to(jnp.arange(width)[None], batch.shape))[0],
                                           axis=-1))
    for row, (p, toks, lp) in enumerate(zip(prompts, outs["pallas"].tokens, outs["pallas"].logprobs)):
      fresh = logp[row, np.arange(len(p) - 1, len(p) - 1 + len(toks)), toks]
      assert np.max(np.abs(fresh - lp)) < 0.15  # bf16 weights + bf16 cache vs fp32
      assert np.mean(np.abs(fresh - lp)) < 0.03
