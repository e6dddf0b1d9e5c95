"""KV-cache sampler: greedy parity with transformers' generate, log-probs vs a fresh forward, no recompilation,
sampling controls, stopping, determinism, sharded parameters on 8 fake CPU devices."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from kevin_jax import sharding as ksharding
from kevin_jax.policy import Qwen2, get_preset, load_pretrained
from kevin_jax.policy import sampler as sampler_lib
from kevin_jax.policy import sampling
from kevin_jax.policy.sampler import Sampler, SamplerConfig
from kevin_jax.policy.tokenizer import load_tokenizer
from tests.test_common import make_hf_qwen2

PROMPT_LENS = (5, 11, 3, 8)
F32 = SamplerConfig(batch_size=4, prompt_buckets=(16,), kv_cache_dtype="float32", max_new_tokens=64)


@pytest.fixture(scope="module")
def hf_ckpt(tmp_path_factory):
  path = tmp_path_factory.mktemp("hf")
  hf = make_hf_qwen2(path, tie=False, num_heads=4, num_kv_heads=2, hidden_size=64, vocab_size=256)
  return hf, path


@pytest.fixture(scope="module")
def prompts():
  rng = np.random.RandomState(11)
  return [rng.randint(0, 256, n).tolist() for n in PROMPT_LENS]


@nnx.jit
def _forward(model, tokens_BxT):
  return model(tokens_BxT, jnp.broadcast_to(jnp.arange(tokens_BxT.shape[1]), tokens_BxT.shape))[0]


def _fresh_logps(model, prompt, tokens, temperature=1.0):
  """Log-probs (at `temperature`) and raw logits of `tokens` after `prompt`, from one full forward pass."""
  seq = np.zeros((1, 96), np.int32)  # one padded shape -> one compile; right padding cannot affect the prefix
  seq[0, :len(prompt) + len(tokens)] = prompt + tokens
  logits = np.asarray(_forward(model, jnp.asarray(seq))[0], np.float64)
  idx = np.arange(len(prompt) - 1, len(prompt) - 1 + len(tokens))
  logp = np.asarray(jax.nn.log_softmax(logits / temperature, axis=-1))
  return logp[idx, tokens], logits[idx]


@pytest.mark.parametrize("v", [151936, 8192, 1000, 700, 300])
def test_argmax_rows_equals_argmax(v):
  """Two-stage argmax == jnp.argmax: random rows, rows of ties (small integers), -inf and NaN entries, a maximum
  in the padded last chunk's real part, and vocabularies that do not divide into the chunks."""
  rng = np.random.RandomState(v)
  rows = [rng.randn(v), rng.randint(0, 3, v).astype(np.float64), np.full(v, -np.inf), np.zeros(v)]
  tail = rng.randn(v)
  tail[-1] = 50.0
  nan = rng.randn(v)
  nan[v // 3] = np.nan
  nan[v // 2] = np.nan
  rows += [tail, nan]
  x = jnp.asarray(np.stack(rows), jnp.float32)
  want = np.asarray(jnp.argmax(x, axis=-1))
  got = np.asarray(jax.jit(sampling.argmax_rows)(x))
  np.testing.assert_array_equal(got, want)
  assert got.dtype == np.int32 and want[3] == 0 and want[4] == v - 1 and want[5] == v // 3


@pytest.mark.parametrize("v", [151936, 8192, 1000, 700, 300])
def test_logsumexp_rows_equals_logsumexp(v):
  """Two-stage logsumexp == jax.scipy's: random rows, a row dominated by one value in the padded last chunk, rows
  with masked (-1e30) and -inf entries (a whole chunk of -inf included), an all -inf row, large magnitudes."""
  rng = np.random.RandomState(v)
  tail = rng.randn(v)
  tail[-1] = 80.0
  masked = rng.randn(v) * 5
  masked[: v // 2] = sampling._NEG  # pylint: disable=protected-access
  holes = rng.randn(v)
  holes[: min(v, 5000)] = -np.inf
  holes[v // 2] = -np.inf
  rows = [rng.randn(v), tail, masked, holes, np.full(v, -np.inf), rng.randn(v) * 1e3 + 3e4]
  x = jnp.asarray(np.stack(rows), jnp.float32)
  want = np.asarray(jax.scipy.special.logsumexp(x, axis=-1))
  got = np.asarray(jax.jit(sampling.logsumexp_rows)(x))
  assert np.isneginf(want[4]) and np.isneginf(got[4])
  np.testing.assert_allclose(got[:4], want[:4], rtol=2e-6, atol=2e-6)
  np.testing.assert_allclose(got[5], want[5], rtol=1e-6)
  assert abs(want[1] - 80.0) < 1e-3


@pytest.mark.parametrize("valid_vocab", [8192, 8000])
@pytest.mark.parametrize("top_k", [0, 50])
def test_sample_logits_logprobs_equal_log_softmax(valid_vocab, top_k):
  """sample_logits' log-probs of the tokens it draws equal log_softmax's, raw and at the temperature, where the
  scaled logits' chunk maxima come from the raw logits' (top_k 0; with a vocabulary mask, from the masked
  logits') and where they are computed afresh (top_k 50); masked tokens are never drawn."""
  rng = np.random.RandomState(valid_vocab + top_k)
  v, t = 8192, 0.7
  logits = rng.randn(6, v).astype(np.float32) * 3
  logits[:, valid_vocab:] += 20.0  # masked columns that would dominate if the mask were lost
  keys = jax.random.split(jax.random.PRNGKey(0), 6)
  fn = jax.jit(lambda x, k: sampling.sample_logits(x, k, jnp.float32(t), jnp.float32(1.0), top_k=top_k,
                                                      greedy=False, use_top_p=False, valid_vocab=valid_vocab))
  tok, raw, samp = (np.asarray(a) for a in fn(jnp.asarray(logits), keys))
  assert np.all(tok < valid_vocab)
  def log_softmax(z):  # float64, per row
    m = z.max(1, keepdims=True)
    return z - m - np.log(np.sum(np.exp(z - m), 1, keepdims=True))

  x = logits.astype(np.float64)
  scaled = np.where(np.arange(v)[None] < valid_vocab, x, sampling._NEG) / t  # pylint: disable=protected-access
  if top_k:
    kth = -np.sort(-scaled, axis=1)[:, top_k - 1:top_k]
    scaled = np.where(scaled >= kth, scaled, sampling._NEG)  # pylint: disable=protected-access
  rows = np.arange(6)
  np.testing.assert_allclose(raw, log_softmax(x)[rows, tok], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(samp, log_softmax(scaled)[rows, tok], rtol=1e-5, atol=1e-5)


def test_reduce_chunks_keep_greedy_and_logprobs(tmp_path, prompts):
  """SamplerConfig.reduce_chunks (two-stage argmax / logsumexp / Gumbel draw) vs 1 (one-stage): the same greedy
  tokens and log-probs; sampled tokens' log-probs (raw and at T) equal a fresh forward pass's. A vocabulary of
  2,100: 8 chunks, the last padded."""
  make_hf_qwen2(tmp_path, vocab_size=2100, hidden_size=32, num_layers=1)
  model = load_pretrained(tmp_path, dtype="float32", compute_dtype="float32")
  greedy = {}
  for chunks in (1, 8):
    sampler = Sampler(model.cfg, None, dataclasses.replace(F32, reduce_chunks=chunks))
    greedy[chunks] = sampler.generate(model, prompts, seed=3, temperature=0.0, max_new_tokens=24)
    hot = sampler.generate(model, prompts, seed=3, temperature=0.7, max_new_tokens=24)
    for i, prompt in enumerate(prompts):
      ref_raw, _ = _fresh_logps(model, prompt, hot.tokens[i])
      ref_hot, _ = _fresh_logps(model, prompt, hot.tokens[i], temperature=0.7)
      np.testing.assert_allclose(hot.logprobs[i], ref_raw, rtol=1e-4, atol=1e-4)
      np.testing.assert_allclose(hot.sampling_logprobs[i], ref_hot, rtol=1e-4, atol=1e-4)
  assert greedy[1].tokens == greedy[8].tokens
  for a, b in zip(greedy[1].logprobs, greedy[8].logprobs):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="reduce_chunks"):
    dataclasses.replace(F32, reduce_chunks=0)


@pytest.mark.parametrize("chunks", [1, 3, 32])
def test_gumbel_sample_rows_draws_from_softmax(chunks):
  """The two-stage draw (chunk by mass, then token within it) samples softmax(x) exactly: 40,000 draws from one
  row of 800 logits (3 chunks of 267, the last padded; 32 -> 3 as V // 256 = 3; 1 = the one-stage draw), with
  masked (_NEG) entries never drawn; every token's count within 5 standard deviations of N p; Pearson's
  chi-square within 6 standard deviations of its degrees of freedom."""
  v, n = 800, 40_000
  rng = np.random.RandomState(chunks)
  x = rng.randn(v) * 2.0
  x[::7] = sampling._NEG  # pylint: disable=protected-access
  keys = jax.random.split(jax.random.PRNGKey(chunks), n)
  draw = jax.jit(lambda k: sampling.gumbel_sample_rows(jnp.broadcast_to(jnp.asarray(x, jnp.float32), (n, v)), k,
                                                          chunks))
  tokens = np.asarray(draw(keys))
  assert tokens.dtype == np.int32 and tokens.min() >= 0 and tokens.max() < v
  counts = np.bincount(tokens, minlength=v)
  p = np.exp(x - x.max())
  p /= p.sum()
  assert counts[::7].sum() == 0
  sd = np.sqrt(n * p * (1 - p))
  assert np.all(np.abs(counts - n * p) <= 5 * sd + 1), np.max(np.abs(counts - n * p) / (sd + 1e-9))
  big = n * p >= 5  # Pearson's chi-square over the tokens expected >= 5 times plus one bin of the rest
  observed = np.append(counts[big], counts[~big].sum())
  expected = np.append(n * p[big], n * p[~big].sum())
  chi2, df = float(np.sum((observed - expected) ** 2 / expected)), len(observed) - 1
  assert chi2 < df + 6 * np.sqrt(2 * df), (chi2, df)  # ~6 standard deviations of a chi-square(df)


def test_greedy_equals_transformers_generate(hf_ckpt, prompts):
  hf, path = hf_ckpt
  model = load_pretrained(path, dtype="float32", compute_dtype="float32")
  out = Sampler(model.cfg, None, F32).generate(model, prompts, seed=0, temperature=0.0, max_new_tokens=64)
  for prompt, tokens, reason in zip(prompts, out.tokens, out.finish_reason):
    with torch.no_grad():
      ref = hf.generate(torch.tensor([prompt]), max_new_tokens=64, min_new_tokens=64, do_sample=False,
                        eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert reason == "length" and len(tokens) == 64
    assert tokens == ref


def test_logprobs_equal_fresh_forward(hf_ckpt, prompts):
  _, path = hf_ckpt
  model = load_pretrained(path, dtype="float32", compute_dtype="float32")
  sampler = Sampler(model.cfg, None, F32)
  out = sampler.generate(model, prompts, seed=3, temperature=1.0, max_new_tokens=64)
  hot = sampler.generate(model, prompts, seed=3, temperature=0.7, max_new_tokens=64)
  for i, prompt in enumerate(prompts):
    ref, _ = _fresh_logps(model, prompt, out.tokens[i])
    np.testing.assert_allclose(out.logprobs[i], ref, atol=1e-4, rtol=0)
    # At temperature 1 without top-k/top-p the sampled distribution is the policy itself.
    np.testing.assert_allclose(out.sampling_logprobs[i], out.logprobs[i], atol=1e-5, rtol=0)
    ref_raw, _ = _fresh_logps(model, prompt, hot.tokens[i])
    ref_hot, _ = _fresh_logps(model, prompt, hot.tokens[i], temperature=0.7)
    np.testing.assert_allclose(hot.logprobs[i], ref_raw, atol=1e-4, rtol=0)
    np.testing.assert_allclose(hot.sampling_logprobs[i], ref_hot, atol=1e-4, rtol=0)
  assert len(set(map(tuple, out.tokens))) == len(prompts)  # actually sampling, not a constant


def test_compiled_once_per_bucket_and_weights_are_arguments(hf_ckpt, prompts):
  _, path = hf_ckpt
  model = load_pretrained(path, dtype="float32", compute_dtype="float32")
  sampler = Sampler(model.cfg, None, F32)
  kw = dict(max_new_tokens=8, top_p=0.9)
  first = sampler.generate(model, prompts, seed=1, temperature=1.0, **kw)
  count = sampler_lib.TRACE_COUNT["generate"]
  # Different prompts (same bucket), seed, temperature, top_p value and updated weights: no new trace.
  state = nnx.state(model, nnx.Param)
  scaled = jax.tree.map(lambda x: x * 1.5, state)
  other = [p[::-1] for p in prompts]
  second = sampler.generate(scaled, other, seed=2, temperature=0.5, top_p=0.8, max_new_tokens=8)
  assert sampler_lib.TRACE_COUNT["generate"] == count
  greedy_new = sampler.generate(scaled, prompts, seed=1, temperature=1e-9, **kw)
  assert sampler_lib.TRACE_COUNT["generate"] == count
  assert first.tokens != second.tokens
  # The new weights really were used: logprobs match a forward pass of the scaled model.
  nnx.update(model, scaled)
  ref, _ = _fresh_logps(model, prompts[0], greedy_new.tokens[0])
  np.testing.assert_allclose(greedy_new.logprobs[0], ref, atol=1e-4, rtol=0)
  sampler.generate(model, prompts, seed=1, temperature=1.0, max_new_tokens=9, top_p=0.9)  # new key
  assert sampler_lib.TRACE_COUNT["generate"] == count + 2  # its prefill and decode functions
  # warmup compiles a key ahead of time; the call afterwards reuses it.
  sampler.warmup(model, 12, max_new_tokens=10, temperature=0.0)
  count = sampler_lib.TRACE_COUNT["generate"]
  sampler.generate(model, prompts, seed=1, temperature=0.0, max_new_tokens=10)
  assert sampler_lib.TRACE_COUNT["generate"] == count


def test_deterministic_per_seed_and_independent_of_chunking(hf_ckpt, prompts):
  _, path = hf_ckpt
  model = load_pretrained(path, dtype="float32", compute_dtype="float32")
  sampler = Sampler(model.cfg, None, F32)
  a = sampler.generate(model, prompts, seed=5, temperature=1.0, max_new_tokens=16)
  b = sampler.generate(model, prompts, seed=5, temperature=1.0, max_new_tokens=16)
  c = sampler.generate(model, prompts, seed=6, temperature=1.0, max_new_tokens=16)
  assert a.tokens == b.tokens and a.tokens != c.tokens
  small = Sampler(model.cfg, None, SamplerConfig(batch_size=2, prompt_buckets=(8, 16), kv_cache_dtype="float32"))
  d = small.generate(model, prompts, seed=5, temperature=1.0, max_new_tokens=16)
  assert d.tokens == a.tokens  # 2 chunks, other buckets: each prompt keeps its own random stream


def test_top_k_and_top_p(hf_ckpt, prompts):
  _, path = hf_ckpt
  model = load_pretrained(path, dtype="float32", compute_dtype="float32")
  sampler = Sampler(model.cfg, None, F32)
  greedy = sampler.generate(model, prompts, seed=0, temperature=0.0, max_new_tokens=16)
  assert sampler.generate(model, prompts, seed=4, temperature=1.5, top_k=1, max_new_tokens=16).tokens == greedy.tokens
  assert sampler.generate(model, prompts, seed=4, temperature=1.5, top_p=1e-6,
                          max_new_tokens=16).tokens == greedy.tokens
  top3 = sampler.generate(model, prompts, seed=4, temperature=2.0, top_k=3, max_new_tokens=16)
  nucleus = sampler.generate(model, prompts, seed=4, temperature=1.0, top_p=0.3, max_new_tokens=16)
  for i, prompt in enumerate(prompts):
    _, logits = _fresh_logps(model, prompt, top3.tokens[i])
    ranks = (logits > logits[np.arange(16), top3.tokens[i]][:, None]).sum(-1)
    assert ranks.max() < 3
    _, logits = _fresh_logps(model, prompt, nucleus.tokens[i])
    probs = np.asarray(jax.nn.softmax(logits, axis=-1))
    chosen = probs[np.arange(16), nucleus.tokens[i]]
    mass_above = np.where(probs > chosen[:, None], probs, 0).sum(-1)
    assert np.all(mass_above < 0.3 + 1e-6)  # the token lies inside the nucleus
    # sampling_logprobs are under the renormalised nucleus: log(p / kept mass) >= log p.
    assert np.all(nucleus.sampling_logprobs[i] >= nucleus.logprobs[i] - 1e-5)
  assert nucleus.tokens != greedy.tokens


def test_eos_and_stop_strings_with_tokenizer():
  tok = load_tokenizer()
  cfg = get_preset("tiny", param_dtype="float32", compute_dtype="float32")
  model = Qwen2(cfg, rngs=nnx.Rngs(0))
  sampler = Sampler(cfg, tok, SamplerConfig(batch_size=2, prompt_buckets=(16,), kv_cache_dtype="float32"))
  prompts = [tok.encode("int main() {"), tok.encode("def f(x):\n")]
  free = sampler.generate(model, prompts, seed=0, temperature=1.0, max_new_tokens=24, eos_ids=[])
  assert free.finish_reason == ["length", "length"]
  assert [tok.decode(t) for t in free.tokens] == free.text
  # EOS: declare the 6th sampled token of prompt 0 an end token; generation stops there and keeps it.
  eos = free.tokens[0][5]
  first = free.tokens[0].index(eos)
  out = sampler.generate(model, prompts, seed=0, temperature=1.0, max_new_tokens=24, eos_ids=[eos])
  assert out.finish_reason[0] == "eos" and out.tokens[0] == free.tokens[0][:first + 1]
  assert out.text[0] == tok.decode(free.tokens[0][:first])
  np.testing.assert_allclose(out.logprobs[0], free.logprobs[0][:first + 1], atol=1e-6)
  # Stop string: a piece of prompt 1's free text; output is cut right after the token completing it.
  text = free.text[1]
  stop = text[len(text) // 2: len(text) // 2 + 3]
  out = sampler.generate(model, prompts, seed=0, temperature=1.0, max_new_tokens=24, eos_ids=[],
                         stop_strings=["\x00never", stop])
  k = len(out.tokens[1])
  assert out.finish_reason[1] == "stop" and out.tokens[1] == free.tokens[1][:k]
  assert stop in out.text[1] and stop not in tok.decode(out.tokens[1][:-1])
  assert len(out.logprobs[1]) == k
  # A model vocabulary larger than the tokenizer's (Qwen pads its embedding): padded ids are never sampled.
  wide_cfg = cfg.replace(vocab_size=tok.vocab_size + 64)
  wide = Qwen2(wide_cfg, rngs=nnx.Rngs(0))
  wide.embed.embedding[...] = wide.embed.embedding[...].at[tok.vocab_size:].set(0.3)  # give them real mass
  out = Sampler(wide_cfg, tok, sampler.cfg).generate(wide, prompts, seed=0, temperature=1.0, max_new_tokens=24,
                                                     eos_ids=[])
  assert max(max(t) for t in out.tokens) < tok.vocab_size
  gap = np.concatenate(out.sampling_logprobs) - np.concatenate(out.logprobs)  # renormalised over allowed ids
  assert np.all(gap >= -1e-6) and np.max(gap) > 1e-3


def test_sharded_params_and_batch_on_mesh(hf_ckpt, prompts, cpu_devices8):
  _, path = hf_ckpt
  mesh = ksharding.make_mesh((("fsdp", 4), ("tensor", 2)), cpu_devices8)
  rules = {"embed": "fsdp", "vocab": None, "q_heads": "tensor", "kv_heads": "tensor", "mlp": "tensor",
           "head_dim": None}
  sharded = load_pretrained(path, dtype="float32", compute_dtype="float32",
                            shardings=lambda p, names, s: NamedSharding(mesh, P(*(rules[n] for n in names))))
  plain = load_pretrained(path, dtype="float32", compute_dtype="float32")
  assert sharded.layers[0].mlp.up_kernel.get_value().sharding.spec == P("fsdp", "tensor")
  ref = Sampler(plain.cfg, None, F32).generate(plain, prompts, seed=0, temperature=0.0, max_new_tokens=16)
  on_mesh = Sampler(plain.cfg, None, F32, mesh=mesh, batch_axes="fsdp")
  out = on_mesh.generate(sharded, prompts, seed=0, temperature=0.0, max_new_tokens=16)
  assert out.tokens == ref.tokens
  for a, b in zip(out.logprobs, ref.logprobs):
    np.testing.assert_allclose(a, b, atol=1e-5)
  # Fewer prompts than the batch axis has devices (3 rows over 8): rows are padded to a multiple of 8.
  mesh8 = ksharding.make_mesh((("fsdp", 8), ("tensor", 1)), cpu_devices8)
  replicated = load_pretrained(path, dtype="float32", compute_dtype="float32",
                               shardings=NamedSharding(mesh8, P()))
  out3 = Sampler(plain.cfg, None, F32, mesh=mesh8, batch_axes="fsdp").generate(
      replicated, prompts[:3], seed=0, temperature=0.0, max_new_tokens=16)
  assert out3.tokens == ref.tokens[:3]


def test_input_errors(hf_ckpt):
  _, path = hf_ckpt
  model = load_pretrained(path, dtype="float32")
  sampler = Sampler(model.cfg, None, F32)
  with pytest.raises(ValueError, match="exceeds the largest prompt bucket 16"):
    sampler.generate(model, [[1] * 17], seed=0)
  with pytest.raises(ValueError, match="prompt 1 is empty"):
    sampler.generate(model, [[1], []], seed=0)
  with pytest.raises(ValueError, match="outside"):
    sampler.generate(model, [[256]], seed=0)
  with pytest.raises(ValueError, match="stop_strings need a tokenizer"):
    sampler.generate(model, [[1]], seed=0, stop_strings=["x"])


def test_generate_cli(tmp_path, capsys):
  from kevin_jax.policy import generate, save_pretrained  # pylint: disable=g-import-not-at-top
  tok = load_tokenizer()
  cfg = get_preset("tiny", param_dtype="float32", compute_dtype="float32")
  model = Qwen2(cfg, rngs=nnx.Rngs(1))
  save_pretrained(model, tmp_path)
  tok.hf.save_pretrained(tmp_path)
  for chat in (False, True):
    argv = ["--checkpoint", str(tmp_path), "--prompt", "__global__ void", "--max-new-tokens", "12"]
    assert generate.main(argv + (["--chat"] if chat else [])) == 0
    printed = capsys.readouterr().out
    ids = tok.encode_chat([{"role": "user", "content": "__global__ void"}]) if chat else tok.encode(
        "__global__ void")
    sampler = Sampler(cfg, tok, SamplerConfig(batch_size=1, prompt_buckets=(16,), kv_cache_dtype="float32"))
    ref = sampler.generate(model, [ids], seed=0, temperature=0.0, max_new_tokens=12)
    assert printed == ref.text[0] + "\n"
