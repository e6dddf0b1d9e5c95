"""experiments/turn_table.py: per-turn designs and what each next turn did with the previous feedback."""
import gzip
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))

import sample_diversity  # pylint: disable=g-import-not-at-top,wrong-import-position
import turn_table  # pylint: disable=g-import-not-at-top,wrong-import-position
from kevin_jax.kernels import suite  # pylint: disable=wrong-import-position
from kevin_jax.rl import prompts  # pylint: disable=wrong-import-position

TASK = "level1/01_ReLU"


def _row(traj, turn, text, status, score):
  response = prompts.format_response("Okay, plan.", text, "a kernel") if text else "<think>\nOkay, the"
  return {"task_id": TASK, "traj": traj, "turn": turn, "response": response,
          "result": {"status": status, "score": score}}


def test_turns_and_what_followed_each_outcome(tmp_path):
  cands = {c.name: c.text for c in {t.id: t for t in suite.load_suite([1])}[TASK].candidates()}
  rows = [  # Trajectory 0: naive -> optimized -> optimized; 1: wrong -> wrong -> no kernel; 2: naive -> naive -> wrong.
      _row(0, 0, cands["naive"], "correct", 0.8), _row(0, 1, cands["optimized"], "correct", 1.4),
      _row(0, 2, cands["optimized"], "correct", 1.4),
      _row(1, 0, cands["wrong_tail"], "incorrect", 0.0), _row(1, 1, cands["wrong_leaky"], "incorrect", 0.0),
      _row(1, 2, "", "format_error", 0.0),
      _row(2, 2, cands["wrong_boundary"], "incorrect", 0.0), _row(2, 0, cands["naive"], "correct", 0.8),
      _row(2, 1, cands["naive"], "correct", 0.8)]
  path = tmp_path / "eval.jsonl.gz"
  with gzip.open(path, "wt") as f:
    f.write("".join(json.dumps(r) + "\n" for r in rows))
  tab = turn_table.table(turn_table.read_turns(str(path)), sample_diversity.suite_designs())
  t1, t2, t3 = (tab["turns"][k] for k in (1, 2, 3))
  assert t1 == {"n": 3, "score": 1.6 / 3, "correct": 2, "copies": 2, "format_errors": 0,
                "designs": {"optimized": 0, "naive": 2, "wrong": 1, "novel": 0, "malformed": 0}}
  assert t2["designs"] == {"optimized": 1, "naive": 1, "wrong": 1, "novel": 0, "malformed": 0}
  assert t3["designs"]["malformed"] == 1 and t3["format_errors"] == 1 and abs(t3["score"] - 1.4 / 3) < 1e-12
  # After naive (3 times): optimized once, naive again once, wrong once; after wrong (twice): wrong, no kernel.
  assert tab["after"]["naive"] == {"n": 3, "optimized": 1, "same": 1, "correct": 2}
  assert tab["after"]["wrong"] == {"n": 2, "optimized": 0, "same": 1, "correct": 0}
  assert tab["after"]["optimized"] == {"n": 1, "optimized": 1, "same": 1, "correct": 1}
  assert "| 1 | 3 | 0.533 | 2 | 2 | 0 | 0 / 2 / 1 / 0 / 0 |" in turn_table.render("x", tab)


def test_correct_kernels_that_are_not_copies_and_the_paired_change(tmp_path, capsys):
  cands = {c.name: c.text for c in {t.id: t for t in suite.load_suite([1])}[TASK].candidates()}
  reworded = cands["naive"].replace("```cuda\n", "```cuda\n// one thread per element\n", 1)
  edited = cands["naive"].replace("0.0f", "0.f", 1)
  assert reworded != cands["naive"] and edited != cands["naive"]
  before = [_row(0, 0, cands["naive"], "correct", 0.8), _row(1, 0, cands["wrong_tail"], "incorrect", 0.0)]
  after = [_row(0, 0, reworded, "correct", 0.8), _row(1, 0, edited, "correct", 1.0)]
  tab = turn_table.table(after, sample_diversity.suite_designs())
  # A reworded comment is still the naive design; a changed token is a kernel of its own.
  assert tab["turns"][1]["correct"] == 2 and tab["turns"][1]["copies"] == 1
  assert tab["turns"][1]["designs"]["naive"] == 1 and tab["turns"][1]["designs"]["novel"] == 1
  c = turn_table.paired(before, after)
  assert c["tasks"] == 1 and abs(c["mean"] - 0.5) < 1e-12 and (c["up"], c["down"]) == (1, 0)
  paths = []
  for name, rows in (("before", before), ("after", after)):
    paths.append(tmp_path / f"{name}.jsonl")
    paths[-1].write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert turn_table.main([str(paths[1]), "--csv", str(tmp_path / "t.csv"), "--paired", *map(str, paths)]) == 0
  assert "per-task change +0.500" in capsys.readouterr().out
  lines = (tmp_path / "t.csv").read_text().splitlines()
  assert lines[0].split(",")[:5] == ["file", "turn", "n", "score", "correct"] and lines[1].endswith(",1,2,0.9,2,1,0,0,1,0,1,0")
