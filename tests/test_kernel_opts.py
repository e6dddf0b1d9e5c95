"""experiments/kernel_opts.py: --kernel-opts of profile_decode.py and bench_sampler.py."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import kernel_opts  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_kernel_opts_parse_and_rebind(monkeypatch):
  """--kernel-opts: module.function:key=value,...; ';' between kernels; integers become ints. Applying rebinds the
  function on its module (restored here by monkeypatch), which the model looks up when it traces a decode step."""
  from kevin_jax.policy import decode_attention, decode_mlp  # pylint: disable=g-import-not-at-top
  spec = "decode_mlp.swiglu_front:num_stages=5,block_n=32; decode_attention.decode_attention:merge=unrolled"
  assert kernel_opts.parse_kernel_opts(spec) == [
      ("decode_mlp", "swiglu_front", {"num_stages": 5, "block_n": 32}),
      ("decode_attention", "decode_attention", {"merge": "unrolled"})]
  assert kernel_opts.parse_kernel_opts("") == []
  for bad in ("decode_mlp:num_stages=5", "decode_mlp.swiglu_front", "decode_mlp.swiglu_front:num_stages"):
    with pytest.raises(ValueError, match="--kernel-opts"):
      kernel_opts.parse_kernel_opts(bad)
  originals = (decode_mlp.swiglu_front, decode_attention.decode_attention)
  monkeypatch.setattr(decode_mlp, "swiglu_front", originals[0])
  monkeypatch.setattr(decode_attention, "decode_attention", originals[1])
  kernel_opts.apply_kernel_opts(spec)
  assert decode_mlp.swiglu_front.func is originals[0]
  assert decode_mlp.swiglu_front.keywords == {"num_stages": 5, "block_n": 32}
  assert decode_attention.decode_attention.keywords == {"merge": "unrolled"}
