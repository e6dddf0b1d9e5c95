"""kevin_jax.evaluate's orchestration with a fake policy and a scripted evaluator."""

import json
import os

import pytest

from kevin_jax import evaluate
from kevin_jax.rl import prompts
from kevin_jax.rl import rollout as ro

SOURCES = {"t1": "class Model: pass  # 1", "t2": "class Model: pass  # 2"}
CAND = "```cuda\n__global__ void k() {}\n```\n```plan\nlaunch k grid=(1,) block=(1,) args=()\n```"


def encode_chat(messages):
  return [ord(c) % 256 for c in messages[-1]["content"]]


def fake_generate(prompt_ids, seed):
  # The response names how many attempts the prompt shows, so the reward can depend on the turn.
  texts = []
  for p in prompt_ids:
    n = "".join(map(chr, p)).count("### Attempt")
    texts.append(prompts.format_response("Okay,", CAND, f"turn{n}"))
  return ro.Generation([[1]] * len(texts), texts, [[-1.0]] * len(texts), ["eos"] * len(texts))


def turn_reward(items):
  # Turn 0 incorrect; turn k>0 correct with speedup 0.5 * k: refinement helps.
  out = []
  for it in items:
    k = int(it.parsed.summary[len("turn"):])
    out.append({"status": "correct" if k else "incorrect", "speedup": 0.5 * k, "score": 0.3 + 0.5 * k if k else 0,
                "feedback": f"turn {k}"})
  return out


def _settings(**kw):
  base = dict(trajectories=2, turns=3, budgets=((2, 3), (6, 1)), beam=True, beam_width=1, beam_clones=2,
              beam_rounds=2, beam_turns_per_round=1, max_context_tokens=10**6, feedback_max_chars=100)
  base.update(kw)
  return evaluate.EvalSettings(**base)


def test_report_numbers_and_files(tmp_path):
  rep = evaluate.run_evaluation(["t1", "t2"], SOURCES, _settings(), seed=0, generate=fake_generate,
                                reward=turn_reward, encode_chat=encode_chat, out_dir=str(tmp_path))
  per_turn = rep["per_turn"]
  assert [r["turn"] for r in per_turn] == [1, 2, 3]
  assert per_turn[0]["correct_best"] == 0.0 and per_turn[0]["perf_best"] == 0.0
  assert per_turn[1]["perf_best"] == pytest.approx(0.5) and per_turn[2]["perf_best"] == pytest.approx(1.0)
  assert per_turn[2]["fast_1_avg"] == 1.0 and per_turn[2]["fast_1.5_best"] == 0.0
  # Fixed budget: 2x3 reaches 1.0x, 6x1 (single-turn) never gets a correct kernel.
  b = {(x["trajectories"], x["turns"]): x for x in rep["budgets"]}
  assert b[(2, 3)]["perf_best"] == pytest.approx(1.0) and b[(6, 1)]["correct_best"] == 0.0
  assert b[(6, 1)]["kernels"] == 6
  # Beam: round 1 (1 turn) finds nothing, round 2 continues the kept trajectory's history -> turn1 -> 0.5x.
  assert [r["perf_best"] for r in rep["beam"]] == [0.0, pytest.approx(0.5)]
  for name in ("results.md", "results.csv", "scaling.png", "trajectories.jsonl", "report.json"):
    assert os.path.getsize(tmp_path / name) > 0, name
  md = (tmp_path / "results.md").read_text()
  assert "| 3 | 100% | 100% | 1.00x |" in md
  runs = {json.loads(l)["run"] for l in open(tmp_path / "trajectories.jsonl")}
  assert runs == {"main", "budget_6x1", "beam"}


def test_novelty_of_correct_kernels_in_reports_and_summaries(tmp_path):
  """Every correct kernel here is CAND: a copy of the corpus when the corpus holds it, novel otherwise."""
  from kevin_jax.rl import kernel_metrics as km  # pylint: disable=g-import-not-at-top
  copy = km.CorpusIndex([CAND.replace("{}", "{ }")])  # Same tokens: a normalised copy.
  other = km.CorpusIndex(["```cuda\n__global__ void j(float* y) { y[0] = 1.0f; }\n```"])
  s = _settings(budgets=(), beam=False)
  rep = evaluate.run_evaluation(["t1"], SOURCES, s, seed=0, generate=fake_generate, reward=turn_reward,
                                encode_chat=encode_chat, out_dir=str(tmp_path), novelty_index=copy)
  # 2 trajectories x 3 turns, turns 2 and 3 correct: 4 correct kernels, all copies.
  assert rep["novelty"] == {"novelty/correct_kernels": 4.0, "novelty/novel_share": 0.0,
                            "novelty/novel_distinct": 0.0, "novelty/nearest_jaccard_mean": 1.0}
  assert "4 correct kernels against the warm-start corpus: 0% are not copies" in (tmp_path / "results.md").read_text()
  out, _ = evaluate.evaluate_policy(["t1"], SOURCES, s, seed=0, generate=fake_generate, reward=turn_reward,
                                    encode_chat=encode_chat, novelty_index=other)
  assert out["novelty/novel_share"] == 1.0 and out["novelty/novel_distinct"] == 1.0
  assert 0.0 < out["novelty/nearest_jaccard_mean"] < 1.0
  plain, _ = evaluate.evaluate_policy(["t1"], SOURCES, s, seed=0, generate=fake_generate, reward=turn_reward,
                                      encode_chat=encode_chat)
  assert not any(k.startswith("novelty/") for k in plain)


def test_task_level_results_are_left_out_of_the_summary():
  """t2 never gets a verdict (every turn task-level, e.g. too large for the GPU): the summary equals the summary of
  t1 alone, with t2 counted as not evaluated and its kernels as task-level."""
  def reward(items):
    out = turn_reward(items)
    for it, r in zip(items, out):
      if it.task_id == "t2":
        r.update(status="runtime_error", speedup=0.0, score=0.0, flags=["evaluator_error", "task_too_large"])
    return out
  s = _settings(budgets=(), beam=False)
  both, _ = evaluate.evaluate_policy(["t1", "t2"], SOURCES, s, seed=0, generate=fake_generate, reward=reward,
                                     encode_chat=encode_chat)
  alone, _ = evaluate.evaluate_policy(["t1"], SOURCES, s, seed=0, generate=fake_generate, reward=turn_reward,
                                      encode_chat=encode_chat)
  assert both["tasks_not_evaluated"] == 1.0 and both["kernel/task_level"] == 6.0
  assert alone["tasks_not_evaluated"] == 0.0 and alone["kernel/task_level"] == 0.0
  for k in ("correct_best", "perf_best", "perf_avg", "kernel/score_mean", "kernel/correct_rate"):
    assert both[k] == pytest.approx(alone[k]), k
  assert both["perf_best"] == pytest.approx(1.0)


def test_budgets_report_best_so_far_per_turn(tmp_path):
  """Each fixed-budget shape carries its per-turn best-so-far rows (the paper's Fig. 5 reading), in report.json and
  results.csv: 2 x 3 reaches 0.5x after turn 2 and 1.0x after turn 3; 6 x 1 stays at 0 correct."""
  import csv  # pylint: disable=g-import-not-at-top
  rep = evaluate.run_evaluation(["t1", "t2"], SOURCES, _settings(beam=False), seed=0, generate=fake_generate,
                                reward=turn_reward, encode_chat=encode_chat, out_dir=str(tmp_path))
  b = {(x["trajectories"], x["turns"]): x for x in json.load(open(tmp_path / "report.json"))["budgets"]}
  assert [r["turn"] for r in b[(2, 3)]["per_turn"]] == [1, 2, 3]
  assert [r["perf_best"] for r in b[(2, 3)]["per_turn"]] == [0.0, pytest.approx(0.5), pytest.approx(1.0)]
  assert [r["correct_avg"] for r in b[(2, 3)]["per_turn"]] == [0.0, 1.0, 1.0]
  assert [r["correct_best"] for r in b[(6, 1)]["per_turn"]] == [0.0]
  assert b[(2, 3)]["per_turn"][-1]["perf_best"] == rep["budgets"][0]["perf_best"]
  rows = [r for r in csv.DictReader(open(tmp_path / "results.csv")) if r["table"] == "budget_2x3_turn"]
  assert [(r["turns"], float(r["perf_best"])) for r in rows] == [("1", 0.0), ("2", 0.5), ("3", 1.0)]
