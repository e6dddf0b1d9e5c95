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
  assert recs[0]["moved"] == 0.0 and 0.0 < recs[1]["moved"] < 0.05  # Distance from the warm start, relative.


def test_free_tokens_are_not_scored():
  target = [5, 6, 7, 8, 9, 1]  # 2 free ("reasoning") tokens, 3 scored ones, EOS.
  assert toy.is_correct([0, 0, 7, 8, 9, 1], target, tolerance=0, free_len=2)  # Free tokens may differ.
  assert not toy.is_correct([5, 6, 7, 0, 9, 1], target, tolerance=0, free_len=2)
  assert toy.is_correct([5, 6, 7, 0, 9, 1], target, tolerance=1, free_len=2)
  assert not toy.is_correct([0, 0, 7, 8, 9, 1], target, tolerance=1, free_len=0)  # Two differences when scored.
  assert not toy.is_correct([5, 6, 7, 8, 9], target, tolerance=5, free_len=2)  # Length must match.


def test_free_len_prob_weight_and_sgd_arms_run(tmp_path):
  out = tmp_path / "toy.jsonl"
  assert toy.main(["--sft-steps", "80", "--lrs", "0.5", "--rl-steps", "1", "--eval-every", "1", "--prompts", "4",
                   "--free-len", "4", "--target-len", "8", "--group", "8", "--eval-samples", "8",
                   "--negative-scales", "0", "--prob-weights", "0,1", "--optimizer", "sgd", "--temperature", "0.6",
                   "--out", str(out)]) == 0
  recs = [json.loads(line) for line in open(out, encoding="utf-8")]
  assert [(r["adv_prob_weight"], r["step"]) for r in recs] == [(0.0, 0), (0.0, 1), (1.0, 0), (1.0, 1)]
  assert all(r["optimizer"] == "sgd" and r["free_len"] == 4 and r["temperature"] == 0.6 for r in recs)
  assert 12.5 <= recs[0]["len"] <= 13.5  # 4 free + 8 scored tokens + EOS.
  assert all(math.isfinite(r["nll_free"]) and r["nll_free"] >= 0 for r in recs)
  assert recs[1]["moved"] > 0 and recs[3]["moved"] > 0
