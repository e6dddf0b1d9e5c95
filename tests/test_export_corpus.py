"""kevin_jax/data/export_corpus.py: the suite as warm-start examples in the policy's prompt/response format.

The results file here is built with the evaluator's own result/feedback code (kernels/result.py) for the
statuses each candidate is labelled with; the committed corpus uses the real H200 run's file instead.
"""

import collections
import json

import pytest

from kevin_jax.data import export_corpus
from kevin_jax.kernels import suite
from kevin_jax.kernels.result import EvalResult, finalize
from kevin_jax.rl import prompts, rollout, sft_data

TASKS = ["level1/01_ReLU", "level1/04_ELU", "level1/07_Argmax"]


def _result(task_id, c, speedup):
  r = EvalResult(task_id=task_id, status=c.expect)
  if c.expect == "correct":
    r.speedup, r.ref_time_ms = speedup, 0.6
    r.cand_time_ms = r.ref_time_ms / speedup
  elif c.expect == "incorrect":
    r.error = "output 'out' does not match the reference"
    r.details = {"mismatch": {"output": "out", "dtype": "float32", "shape": [8191, 32771], "bad": 253,
                              "numel": 268427261, "atol": 1e-4, "rtol": 1e-4, "trial": 1, "distribution": "task",
                              "nonfinite": 253}}
  elif c.expect == "compile_error":
    r.details = {"compile_log": 'default_program(14): error: identifier "n4" is undefined'}
  else:
    r.error = f"{c.expect} in launch 1"
  return finalize(r)


@pytest.fixture()
def results_file(tmp_path):
  data = {"source": {"device": "test"}, "results": {}}
  for t in suite.load_suite([1]):
    if t.id not in TASKS:
      continue
    for c in t.candidates():
      r = _result(t.id, c, {"naive": 0.5, "optimized": 1.1}.get(c.name, 1.0))
      data["results"].setdefault(t.id, {})[c.name] = {"status": r.status, "speedup": r.speedup,
                                                      "ref_time_ms": r.ref_time_ms, "cand_time_ms": r.cand_time_ms,
                                                      "feedback": r.feedback}
  data["results"]["level1/07_Argmax"]["wrong_iteration_index"]["status"] = "correct"  # Not as labelled.
  path = tmp_path / "suite_results.json"
  path.write_text(json.dumps(data))
  return str(path), data


def _records(path):
  return [json.loads(line) for line in open(path, encoding="utf-8")]


def test_export_with_results(tmp_path, results_file):
  path, data = results_file
  out = str(tmp_path / "corpus.jsonl")
  counts = export_corpus.export(out, path, levels=[1])
  recs = sft_data.read_corpus(out)  # The SFT reader accepts every line.
  assert counts["single"] == 2 * 24
  relu = [r for r in recs if r["task_id"] == "level1/01_ReLU"]
  assert sorted(r["kind"] for r in relu) == ["fix_then_speed_up"] * 3 + ["fix_wrong"] * 3 + ["single"] * 2 + [
      "speed_up"]
  for r in recs:
    parsed = prompts.parse_response(r["response"])
    assert parsed.error == "" and parsed.reasoning.startswith("Okay,")
    assert prompts.opens_as_expected(parsed.reasoning)
    target = next(c for c in suite.load_suite([r["level"]]) if c.id == r["task_id"]).candidates()
    target = {c.name: c for c in target}[r["target"]]
    assert parsed.candidate_text == target.text and parsed.summary == target.summary
    assert r["messages"][0]["role"] == "system" and r["messages"][1]["role"] == "user"
    assert r["turn"] == len(r["attempts"]) + 1
  fix = next(r for r in relu if r["kind"] == "fix_wrong" and r["attempts"] == ["wrong_boundary"])
  user = fix["messages"][1]["content"]
  fb = data["results"]["level1/01_ReLU"]["wrong_boundary"]["feedback"]
  assert fb in user and "### Attempt 1" in user and "grid=(x.numel // 256,)" in user
  assert "Incorrect: output 'out' does not match the reference" in fix["response"]
  assert "rounds down" in fix["response"]  # The variant's bug, from meta.json.
  speed = next(r for r in relu if r["kind"] == "speed_up")
  assert "0.50x" in speed["response"] and "speedup 0.5x" in speed["messages"][1]["content"]
  three = next(r for r in relu if r["kind"] == "fix_then_speed_up")
  assert "### Attempt 2" in three["messages"][1]["content"] and three["target"] == "optimized"
  elu = [r for r in recs if r["task_id"] == "level1/04_ELU" and r["attempts"] == ["wrong_undeclared"]]
  assert elu and 'identifier "n4" is undefined' in elu[0]["messages"][1]["content"]
  argmax = [r for r in recs if r["task_id"] == "level1/07_Argmax"]
  assert not any("wrong_iteration_index" in r["attempts"] for r in argmax)  # Status != label: left out.
  assert any(r["attempts"] == ["wrong_int32_out"] for r in argmax)
  # Tasks without results get single-turn examples only.
  swish = [r for r in recs if r["task_id"] == "level1/03_Swish"]
  assert [r["kind"] for r in swish] == ["single", "single"]


def test_later_turn_kinds_show_the_prompts_rollouts_produce(tmp_path, results_file):
  """Opt-in kinds: after a response that ended inside its reasoning the prompt is exactly the rollout's (whatever
  the derailed text was), and after the fast solution it carries that solution's real feedback."""
  path, data = results_file
  out = str(tmp_path / "corpus.jsonl")
  counts = export_corpus.export(out, path, levels=[1], kinds=export_corpus.ALL_KINDS)
  relu = {r["kind"]: r for r in _records(out) if r["task_id"] == "level1/01_ReLU"}
  assert set(relu) == set(export_corpus.ALL_KINDS)
  for kind in export_corpus.LATER_TURN_KINDS:
    # keep_fast and fast_then_format quote recorded feedback: the three tasks with records; the format-error kinds
    # need none (the rollout's own format-error text): every level-1 task.
    assert counts[kind] == (24 if kind in export_corpus.NO_FEEDBACK_KINDS else 3), kind
    parsed = prompts.parse_response(relu[kind]["response"])
    assert parsed.error == "" and relu[kind]["target"] == "optimized" and prompts.opens_as_expected(parsed.reasoning)
    # The whole reasoning comes back (a quoted "</think>" would end it early and leave prose before the code).
    assert parsed.candidate_text.startswith("```") and "think tag" not in parsed.candidate_text
  # What rl/rollout.py appends to a trajectory's history after a derailed response (its own code path).
  derailed = prompts.parse_response("<think>\nOkay, the previous kernel wasnoneeak of its sum-of-memory task")
  seen = prompts.Attempt(derailed.candidate_text, derailed.summary,
                         str(rollout.format_error_result(derailed.error)["feedback"])[:2000])
  task = next(t for t in suite.load_suite([1]) if t.id == "level1/01_ReLU")
  assert relu["retry_format"]["messages"] == prompts.build_messages(task.spec.source, [seen])
  assert relu["format_twice"]["messages"] == prompts.build_messages(task.spec.source, [seen, seen])
  assert relu["retry_format"]["turn"] == 2 and relu["format_twice"]["turn"] == 3
  opt = {c.name: c for c in task.candidates()}["optimized"]
  fast = prompts.Attempt(opt.text, opt.summary, data["results"]["level1/01_ReLU"]["optimized"]["feedback"])
  assert relu["keep_fast"]["messages"] == prompts.build_messages(task.spec.source, [fast])
  assert relu["fast_then_format"]["messages"] == prompts.build_messages(task.spec.source, [fast, seen])
  assert "1.10x" in relu["keep_fast"]["response"]  # Its recorded speedup.
  assert "ended inside the reasoning (no closing think tag)" in relu["retry_format"]["response"]
  # The default corpus has none of them; unknown kinds are errors naming the known ones.
  assert {r["kind"] for r in export_corpus.examples_for_task(task, data["results"]["level1/01_ReLU"])[0]} == set(
      export_corpus.KINDS)
  with pytest.raises(ValueError, match="known: single"):
    export_corpus.examples_for_task(task, {}, kinds=("single", "retry"))
  assert export_corpus.main(["--out", out, "--results", path, "--levels", "1", "--kinds", "single,keep_fast"]) == 0
  assert {r["kind"] for r in _records(out)} == {"single", "keep_fast"}


def test_first_wrong_makes_the_first_turn_a_mixture(tmp_path, results_file):
  """Opt-in first_wrong: the task alone -> each wrong variant whose recorded status is its label, in the single
  examples' prompt and reasoning style; with `single`, the first turns mix naive, optimized and wrong kernels."""
  path, _ = results_file
  out = str(tmp_path / "corpus.jsonl")
  counts = export_corpus.export(out, path, levels=[1], kinds=("single", "first_wrong"))
  recs = _records(out)
  by_task = {t.id: t for t in suite.load_suite([1])}
  # ReLU 3 + ELU 2 + Argmax 3 variants, less Argmax's mislabelled one; tasks without results get none.
  expect = sum(1 for tid in TASKS for c in by_task[tid].candidates() if c.kind == "variant") - 1
  assert counts == {"single": 2 * 24, "first_wrong": expect} and expect == 7
  for r in (r for r in recs if r["kind"] == "first_wrong"):
    task = by_task[r["task_id"]]
    target = {c.name: c for c in task.candidates()}[r["target"]]
    assert target.kind == "variant" and target.expect != "correct" and r["quality"] == "wrong"
    assert r["turn"] == 1 and r["attempts"] == []
    assert r["messages"] == prompts.build_messages(task.spec.source, [])
    parsed = prompts.parse_response(r["response"])
    assert parsed.error == "" and parsed.candidate_text == target.text and parsed.summary == target.summary
    assert parsed.reasoning == export_corpus.reasoning_single(task.meta, target)
    assert target.bug.rstrip(".") not in r["response"]  # Nothing says it is wrong.
  assert "wrong_iteration_index" not in {r["target"] for r in recs}
  assert {r["quality"] for r in recs if r["kind"] == "single"} == {"correct"}
  relu = [r["target"] for r in recs if r["task_id"] == "level1/01_ReLU"]
  assert sorted(relu) == ["naive", "optimized", "wrong_boundary", "wrong_leaky", "wrong_tail"]
  assert "first_wrong" not in export_corpus.KINDS  # Opt-in.


def test_later_mixture_pairs_every_acted_on_feedback_with_one_that_is_not(tmp_path, results_file):
  """Opt-in slow_again / wrong_again: the prompts of speed_up / fix_wrong (the same attempt and feedback), but the
  naive solution again or the task's next known-wrong variant, so turn 2 mixes acting and not acting 1 : 1."""
  path, _ = results_file
  out = str(tmp_path / "corpus.jsonl")
  kinds = ("speed_up", "slow_again", "fix_wrong", "wrong_again")
  counts = export_corpus.export(out, path, levels=[1], kinds=kinds, reasoning="plain")
  recs = _records(out)
  assert counts["slow_again"] == counts["speed_up"] == 3 and counts["wrong_again"] == counts["fix_wrong"] == 7
  by_task = {t.id: t for t in suite.load_suite([1])}
  for acted, idle in (("speed_up", "slow_again"), ("fix_wrong", "wrong_again")):
    pairs = {(r["task_id"], tuple(r["attempts"])): r for r in recs if r["kind"] == acted}
    for r in (r for r in recs if r["kind"] == idle):
      twin = pairs.pop((r["task_id"], tuple(r["attempts"])))
      assert r["messages"] == twin["messages"] and r["turn"] == twin["turn"] == 2 and twin["target"] == "optimized"
      target = {c.name: c for c in by_task[r["task_id"]].candidates()}[r["target"]]
      parsed = prompts.parse_response(r["response"])
      assert parsed.error == "" and parsed.candidate_text == target.text and parsed.summary == target.summary
      assert prompts.opens_as_expected(parsed.reasoning)
      if idle == "slow_again":
        assert r["target"] == "naive" and r["quality"] == "correct" and "I keep it:" in parsed.reasoning
      else:
        assert target.kind == "variant" and r["quality"] == "wrong" and "the last kernel was wrong" in parsed.reasoning
    assert not pairs  # One each.
  # Each labelled variant is followed by another one (a cycle over ReLU's three), or by itself when it is the only
  # one (Argmax: its other variant's recorded status is not its label).
  moves = [(r["attempts"][0], r["target"]) for r in recs if r["kind"] == "wrong_again" and "ReLU" in r["task_id"]]
  assert len(moves) == 3 and {a for a, _ in moves} == {t for _, t in moves} and all(a != t for a, t in moves)
  moves = [(r["attempts"][0], r["target"]) for r in recs if r["kind"] == "wrong_again" and "Argmax" in r["task_id"]]
  assert moves == [("wrong_int32_out", "wrong_int32_out")]
  # Quote style: the same records, the previous timings quoted.
  quote = str(tmp_path / "quote.jsonl")
  assert export_corpus.export(quote, path, levels=[1], kinds=kinds) == counts
  slow = [r for r in _records(quote) if r["kind"] == "slow_again"]
  assert all("ms for PyTorch (0.50x)" in r["response"] and "I keep it:" in r["response"] for r in slow)
  # FIRST_TURN_MIXTURE (which recorded runs pin) has neither.
  assert not set(export_corpus.LATER_MIXTURE_KINDS) & set(export_corpus.FIRST_TURN_MIXTURE)


def test_plain_reasoning_copies_nothing_from_the_prompt(tmp_path, results_file):
  """reasoning='plain': the same prompts and targets as the default style, but later-turn reasoning built from the
  task and the previous outcome's kind only: no feedback line, timing or variant bug in it, so every fix of one
  task reads the same whichever wrong kernel preceded it."""
  path, data = results_file
  quote, plain = str(tmp_path / "quote.jsonl"), str(tmp_path / "plain.jsonl")
  assert export_corpus.export(quote, path, levels=[1], kinds=export_corpus.ALL_KINDS) == export_corpus.export(
      plain, path, levels=[1], kinds=export_corpus.ALL_KINDS, reasoning="plain")
  q, p = _records(quote), _records(plain)
  assert [(r["task_id"], r["kind"], r["attempts"], r["messages"], r["target"]) for r in q] == [
      (r["task_id"], r["kind"], r["attempts"], r["messages"], r["target"]) for r in p]
  relu = [r for r in p if r["task_id"] == "level1/01_ReLU"]
  fixes = {r["response"] for r in relu if r["kind"] == "fix_wrong"}
  assert len(fixes) == 1 and len([r for r in relu if r["kind"] == "fix_wrong"]) == 3
  feedback_lines = {v["feedback"].splitlines()[0] for t in data["results"].values() for v in t.values()}
  for a, b in zip(q, p):
    parsed = prompts.parse_response(b["response"])
    assert parsed.error == "" and prompts.opens_as_expected(parsed.reasoning)
    assert parsed.candidate_text == prompts.parse_response(a["response"]).candidate_text
    if b["kind"] == "single":
      assert a["response"] == b["response"]
      continue
    assert not any(line in b["response"] for line in feedback_lines)
    description = next(t for t in suite.load_suite([1]) if t.id == b["task_id"]).meta["description"]
    said = parsed.reasoning.replace(export_corpus._sentence(description), "")  # pylint: disable=protected-access
    assert "x against" not in said and " ms " not in said and "bug" not in said
  speed = next(r for r in relu if r["kind"] == "speed_up")
  assert "0.50x" not in speed["response"] and "slower than it can be" in speed["response"]
  assert "fastest design" in next(r for r in relu if r["kind"] == "keep_fast")["response"]
  task = next(t for t in suite.load_suite([1]) if t.id == "level1/01_ReLU")
  with pytest.raises(ValueError, match="known: quote, plain"):
    export_corpus.examples_for_task(task, {}, reasoning="terse")
  assert export_corpus.main(["--out", plain, "--results", path, "--levels", "1", "--reasoning", "plain"]) == 0
  assert [r["response"] for r in _records(plain)] == [r["response"] for r in p if r["kind"] in export_corpus.KINDS]


def test_export_without_results_writes_only_kinds_without_feedback(tmp_path, capsys):
  out = str(tmp_path / "c.jsonl")
  assert export_corpus.main(["--out", out, "--results", "", "--levels", "1"]) == 0
  recs = _records(out)
  assert len(recs) == 48 and {r["kind"] for r in recs} == {"single"}
  assert "no records: single, retry_format, format_twice only" in capsys.readouterr().out
  assert export_corpus.main(["--out", out, "--results", "", "--levels", "1", "--kinds", "all"]) == 0
  assert collections.Counter(r["kind"] for r in _records(out)) == {"single": 48, "retry_format": 24,
                                                                     "format_twice": 24}
  assert all(prompts.format_doc(with_example=True) in r["messages"][1]["content"] for r in recs)


def test_export_split(tmp_path):
  out_train, out_test = str(tmp_path / "tr.jsonl"), str(tmp_path / "te.jsonl")
  export_corpus.export(out_train, None, split="train")
  export_corpus.export(out_test, None, split="test")
  train = {r["task_id"] for r in _records(out_train)}
  test = {r["task_id"] for r in _records(out_test)}
  assert train and test and not train & test
  assert len(train | test) == len(suite.load_suite())


def test_load_results_reads_verify_rows(tmp_path):
  rows = {"results": [{"task_id": "level1/01_ReLU", "candidate": "naive",
                       "result": {"status": "correct", "speedup": 0.9, "ref_time_ms": 0.6, "cand_time_ms": 0.66,
                                  "feedback": "Correct."}}]}
  p = tmp_path / "results.json"
  p.write_text(json.dumps(rows))
  assert export_corpus.load_results(str(p)) == {"level1/01_ReLU": {"naive": {
      "status": "correct", "speedup": 0.9, "ref_time_ms": 0.6, "cand_time_ms": 0.66, "feedback": "Correct."}}}


# --- the task world's corpus ----------------------------------------------------------------------------------------

def _world():
  from kevin_jax.data.taskgen import world  # pylint: disable=g-import-not-at-top
  return world.build(world.WorldConfig(seed=3, train=6, heldout_compositions=3, heldout_styles=2))


def test_world_corpus_follows_the_splits():
  w = _world()
  first = w.split("train")[0]
  recorded = {}
  for c in first.candidates():
    r = _result(first.id, c, {"naive": 0.5, "optimized": 1.1}.get(c.name, 0.8))
    recorded[c.name] = {"status": r.status, "speedup": r.speedup, "ref_time_ms": r.ref_time_ms,
                        "cand_time_ms": r.cand_time_ms, "feedback": r.feedback, "text_sha": export_corpus.text_sha(c.text)}
  stale = next(c.name for c in first.candidates() if c.kind == "variant")
  recorded[stale]["text_sha"] = "0" * 16  # A record of an older text of this candidate: left out.
  recs, notes = export_corpus.world_examples(w, None, {first.id: recorded}, export_corpus.ALL_KINDS, "plain")
  by_task = collections.defaultdict(list)
  for r in recs:
    by_task[r["task_id"]].append(r)
  assert set(by_task) == {t.id for t in w.split("train") + w.split("heldout_styles")}
  for t in w.split("heldout_styles"):
    assert [(r["kind"], r["target"]) for r in by_task[t.id]] == [("single", "naive")]
  for t in w.split("train")[1:]:  # No records: only what needs no evaluator feedback.
    kinds = collections.Counter(r["kind"] for r in by_task[t.id])
    styles = [c.name for c in t.candidates() if c.expect == "correct"]
    assert kinds == {"single": len(styles), "retry_format": 1, "format_twice": 1}
    assert sorted(r["target"] for r in by_task[t.id] if r["kind"] == "single") == sorted(styles)
  mine = by_task[first.id]
  assert {"fix_wrong", "speed_up", "keep_fast", "first_wrong", "wrong_again"} <= {r["kind"] for r in mine}
  assert not any(stale in r["attempts"] or r["target"] == stale for r in mine)
  assert any("another text" in n for n in notes)
  cands = {c.name: c for c in first.candidates()}
  for r in recs:
    parsed = prompts.parse_response(r["response"])
    task = w.by_id()[r["task_id"]]
    target = {c.name: c for c in task.candidates()}[r["target"]]
    assert parsed.error == "" and parsed.candidate_text == target.text and prompts.opens_as_expected(parsed.reasoning)
    assert r["messages"][1]["content"].count(task.source.strip()) == 1
  fix = next(r for r in mine if r["kind"] == "fix_wrong")
  assert recorded[fix["attempts"][0]]["feedback"] in fix["messages"][1]["content"]
  assert cands[fix["target"]].name == "optimized"


def test_no_faster_kernel_of_a_heldout_style_task_is_in_the_corpus():
  """The warm-start corpus of the default world holds none of the heldout_styles tasks' non-naive correct kernels,
  not even as another task's (normalised) response: tasks sharing kernels share a signature, hence a split."""
  from kevin_jax.data.taskgen import world  # pylint: disable=g-import-not-at-top
  from kevin_jax.rl import kernel_metrics as km  # pylint: disable=g-import-not-at-top
  w = world.build(world.WorldConfig())
  recs, _ = export_corpus.world_examples(w, None, None, export_corpus.ALL_KINDS, "plain")
  corpus = {km.normalize(prompts.parse_response(r["response"]).candidate_text) for r in recs}
  faster = [(t.id, c.name, km.normalize(c.text)) for t in w.split("heldout_styles") for c in t.candidates()
            if c.expect == "correct" and c.name != "naive"]
  assert len(faster) >= 2 * len(w.split("heldout_styles"))
  leaked = [(tid, name) for tid, name, text in faster if text in corpus]
  assert not leaked, leaked[:5]
  naive = [km.normalize(next(c.text for c in t.candidates() if c.name == "naive")) for t in w.split("heldout_styles")]
  assert all(n in corpus for n in naive)


def test_world_corpus_in_memory_matches_the_export(tmp_path, monkeypatch):
  from kevin_jax.data.taskgen import world  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("KEVIN_JAX_TASKGEN_DIR", str(tmp_path))
  w = _world()
  d = world.materialize(w.config)
  ids = [t.id for t in w.tasks] + ["level1/01_ReLU"]
  mem = sft_data.bundled_corpus(ids, kinds=("single", "retry_format"), reasoning="plain", source=d)
  exported = export_corpus.world_examples(w, ids, None, ("single", "retry_format"), "plain")[0]
  assert mem == exported
  assert {r["task_id"] for r in mem} == set(ids)  # heldout_compositions: single only; the suite's ReLU as bundled.
  hc = {t.id for t in w.split("heldout_compositions")}
  assert {r["kind"] for r in mem if r["task_id"] in hc} == {"single"}


def test_world_corpus_cli(tmp_path):
  out = str(tmp_path / "world.jsonl")
  assert export_corpus.main(["--out", out, "--source", "generated:3", "--kinds", "single", "--results", ""]) == 0
  from kevin_jax.data.taskgen import world  # pylint: disable=g-import-not-at-top
  w = world.build(world.WorldConfig.parse("generated:3"))
  recs = _records(out)
  n_styles = sum(c.expect == "correct" for t in w.split("train") for c in t.candidates())
  assert len(recs) == n_styles + len(w.split("heldout_styles"))
  with pytest.raises(SystemExit):
    export_corpus.main(["--out", out, "--source", "generated", "--split", "test"])
