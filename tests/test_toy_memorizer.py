"""experiments/toy_memorizer_rl.py: the CPU toy of GRPO on a memorised policy runs and memorises first."""

import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import toy_memorizer_rl as toy  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_warm_start_memorises_and_rl_records_every_evaluation(tmp_path):
  out = tmp_path / "toy.jsonl"
  assert toy.main(["--sft-steps", "80", "--lrs", "1e-4", "--rl-steps", "2", "--eval-every", "2", "--prompts", "4",
                   "--target-len", "8", "--group", "8", "--eval-samples", "8", "--out", str(out)]) == 0
  recs = [json.loads(line) for line in open(out, encoding="utf-8")]
  assert [r["step"] for r in recs] == [0, 2]
  # 80 SFT steps fit 4 random 8-token targets: nearly every T = 0.9 sample is within 2 tokens of its target.
  assert recs[0]["correct"] >= 0.8, recs[0]
  assert 8.5 <= recs[0]["len"] <= 9.5  # 8 tokens + EOS.
  assert all(math.isfinite(r["nll"]) and r["nll"] >= 0 for r in recs)
  assert recs[1]["correct"] >= 0.5, recs[1]  # Two GRPO steps at lr 1e-4 do not wreck it.
