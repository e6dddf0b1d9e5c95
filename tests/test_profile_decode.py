"""experiments/profile_decode.py: decode-only device time per step (a prefill-only call subtracted)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import profile_decode  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_decode_only_subtracts_the_prefill_call_per_step():
  # A call of 255 decode steps: 200 ms of matmuls, 40 ms of them the prefill's; attention only while decoding; a
  # class that only the prefill-only call has comes out negative.
  full = {"matmul": 200.0, "attention": 51.0, "fusion": 30.0}
  prefill = {"matmul": 40.0, "fusion": 4.5, "copy": 2.55}
  got = profile_decode.decode_only(full, prefill, 255)
  assert got == pytest.approx({"matmul": 160 / 255, "attention": 0.2, "fusion": 0.1, "copy": -0.01})
  with pytest.raises(ValueError, match="decode steps"):
    profile_decode.decode_only(full, prefill, 0)
