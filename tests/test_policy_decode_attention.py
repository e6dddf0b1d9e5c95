"""The Pallas decode-attention kernel (policy/decode/attention.py) against the masked einsum, in interpret mode on
the CPU: ragged prompt lengths, several splits, bf16 and fp32 caches (the sampler end to end with it:
tests/test_policy_decode_step.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kevin_jax.policy.decode.attention import SlotRanges, decode_attention, merge_splits, split_share, supported
from kevin_jax.policy.model import decode_attend


def _case(dtype, b=3, k=2, g=7, h=64, p=128, n=256, seed=0):
  rng = np.random.default_rng(seed)
  s = p + n
  q = jnp.asarray(rng.standard_normal((b, k, g, h)), dtype)
  kc = jnp.asarray(rng.standard_normal((b, k, s, h)) * 2, dtype)
  vc = jnp.asarray(rng.standard_normal((b, k, s, h)), dtype)
  return q, kc, vc, s


@pytest.mark.parametrize("splits,balance", [(1, False), (2, False), (3, False), (6, False), (1, True), (2, True),
                                            (5, True), (8, True)])
@pytest.mark.parametrize("gen_len", [1, 64, 65, 150])
def test_matches_masked_einsum_fp32(splits, balance, gen_len):
  """Fixed slot ranges per split, and balanced splits (an equal share of each row's visible blocks; with 5 or 8
  splits some rows' splits get none, and 5 does not divide the 6 blocks)."""
  q, kc, vc, s = _case(jnp.float32)
  ranges = SlotRanges(prompt_len_B=jnp.array([5, 128, 70]), gen_len=jnp.array(gen_len), gen_start=128)
  got = decode_attention(q, kc, vc, ranges, num_splits=splits, balance=balance, interpret=True)
  want = decode_attend(q, kc, vc, ranges.mask(s), True)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("splits", [1, 2, 0])
def test_padded_output_for_the_o_kernel(splits):
  """padded=True with q in decode_qkv's padded layout: one split returns its [B, K, 16, H] output as written (the
  real rows first), several splits the merged [B, K, G, H]; the real rows equal the masked einsum either way."""
  q, kc, vc, s = _case(jnp.float32)
  q_pad = jnp.pad(q, ((0, 0), (0, 0), (0, 16 - q.shape[2]), (0, 0)))
  ranges = SlotRanges(prompt_len_B=jnp.array([5, 128, 70]), gen_len=jnp.array(40), gen_start=128)
  got = decode_attention(q_pad, kc, vc, ranges, groups=7, padded=True, num_splits=splits, interpret=True)
  assert got.shape == (3, 2, 16 if splits == 1 else 7, 64)
  want = decode_attend(q, kc, vc, ranges.mask(s), True)
  np.testing.assert_allclose(np.asarray(got[:, :, :7]), np.asarray(want), rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="padded=True needs groups"):
    decode_attention(q, kc, vc, ranges, padded=True, interpret=True)


def test_split_share_partitions_the_visible_blocks():
  """Balanced splits' shares, over arrays of rows: in split order they tile [0, n) without gaps, each at most
  ceil(n / splits) long; n counts the prompt's and the generated blocks (partial blocks included)."""
  plen = jnp.array([1, 64, 65, 128, 640, 3])
  for glen in (1, 64, 65, 300):
    for splits in (1, 2, 3, 8):
      ends = []
      for s in range(splits):
        n_prompt, n, v0, v1 = (np.asarray(a) for a in split_share(plen, jnp.int32(glen), s, splits, 64))
        np.testing.assert_array_equal(n_prompt, [1, 1, 2, 2, 10, 1])
        np.testing.assert_array_equal(n, n_prompt + -(-glen // 64))
        np.testing.assert_array_equal(v0, ends[-1] if ends else 0)
        assert (v1 - v0 <= -(-n // splits)).all() and (v1 >= v0).all()
        ends.append(v1)
      np.testing.assert_array_equal(ends[-1], n)


def test_merge_splits_weighs_empty_splits_zero():
  """The merge on hand-made partials: split 1 is empty (m = -1e30, l = 0, acc = 0) and must not count; the
  result is sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M), computed here in float64."""
  rng = np.random.default_rng(1)
  o = rng.standard_normal((2, 2, 3, 4, 8)).astype(np.float32)
  m = rng.standard_normal((2, 2, 3, 4)).astype(np.float32) * 3
  l = rng.uniform(0.5, 4.0, (2, 2, 3, 4)).astype(np.float32)
  o[:, :, 1], m[:, :, 1], l[:, :, 1] = 0.0, -1e30, 0.0
  w = np.exp(m.astype(np.float64) - m.max(axis=2, keepdims=True))
  want = (o * w[..., None]).sum(axis=2) / (l * w).sum(axis=2)[..., None]
  for _ in range(1):
    got = merge_splits(jnp.asarray(o), jnp.asarray(m), jnp.asarray(l))
    assert got.shape == (2, 2, 4, 8)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-6)


def test_bf16_cache_and_invisible_slots_ignored():
  q, kc, vc, s = _case(jnp.bfloat16, g=4, h=32)
  ranges = SlotRanges(prompt_len_B=jnp.array([1, 77, 128]), gen_len=jnp.array(40), gen_start=128)
  got = decode_attention(q, kc, vc, ranges, interpret=True)
  want = decode_attend(q, kc, vc, ranges.mask(s), True)
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=2e-2, atol=2e-2)
  # Garbage (huge values) in invisible slots must not change the result.
  mask = np.asarray(ranges.mask(s))[:, None, :, None]
  junk = jnp.where(mask, kc, jnp.asarray(1e4, kc.dtype))
  again = decode_attention(q, junk, jnp.where(mask, vc, jnp.asarray(-1e4, vc.dtype)), ranges, interpret=True)
  np.testing.assert_array_equal(np.asarray(again, np.float32), np.asarray(got, np.float32))


def test_shape_rules():
  assert supported(2048, 1024, 64) and not supported(2050, 1024, 64) and not supported(2048, 1000, 64)
  assert not supported(2048, 1024, 8)
  q, kc, vc, _ = _case(jnp.float32, p=100, n=28)
  with pytest.raises(ValueError, match="multiples of block_k"):
    decode_attention(q, kc, vc, SlotRanges(jnp.array([1, 2, 3]), jnp.array(1), 100), interpret=True)


@pytest.mark.parametrize("balance,splits", [(False, 0), (True, 0), (False, 1)])
@pytest.mark.parametrize("slots", [2048, 1088])
def test_lowers_to_triton(balance, splits, slots):
  """The kernel lowers through Pallas' Triton backend for a GPU target (on the CPU: no device needed) at the
  0.5B shape, B = 64, with a cache of a power of two of slots and not (1,024 prompt + 64 generated); one split
  writes its output itself (no partials)."""
  spec = lambda *shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dtype)
  ranges = SlotRanges(prompt_len_B=spec(64, dtype=jnp.int32), gen_len=spec(dtype=jnp.int32), gen_start=1024)
  fn = lambda q, k, v, r: decode_attention(q, k, v, r, balance=balance, num_splits=splits)
  text = jax.jit(fn).trace(spec(64, 2, 7, 64), spec(64, 2, slots, 64), spec(64, 2, slots, 64), ranges).lower(
      lowering_platforms=("cuda",)).as_text()
  assert text.count("__gpu$xla.gpu.triton") == 1
