"""kevin_jax/report/standard.py on hand-made results: fast_p, geometric means, best@k / avg@k per turn, files."""

import csv
import math
import shutil
import subprocess

import pytest

from kevin_jax.report import standard


def _rec(task, traj, turn, status, speedup=None, compile_speedup=None):
  details = {} if compile_speedup is None else {"speedup_compile": compile_speedup}
  return {"task_id": task, "traj": traj, "turn": turn,
          "result": {"status": status, "speedup": speedup, "details": details}}


# 4 tasks x 2 trajectories x 2 turns; trajectory ids numbered across tasks, as rollouts number them.
RECORDS = [
    _rec("A", 0, 0, "incorrect"), _rec("A", 0, 1, "correct", 1.2, 0.8),
    _rec("A", 1, 0, "correct", 0.5, "n/a"), _rec("A", 1, 1, "correct", 2.5, 1.6),
    _rec("B", 2, 0, "incorrect"), _rec("B", 2, 1, "compile_error"),
    _rec("B", 3, 0, "incorrect"), _rec("B", 3, 1, "incorrect"),
    _rec("C", 4, 0, "correct", 1.0, "n/a"), _rec("C", 4, 1, "compile_error"),
    _rec("C", 5, 0, "compile_error"), _rec("C", 5, 1, "compile_error"),
    _rec("D", 6, 0, "incorrect"), _rec("D", 6, 1, "correct", 0.25, 0.1),
    _rec("D", 7, 0, "incorrect"), _rec("D", 7, 1, "incorrect"),
]
LEVELS = {"A": 1, "B": 1, "C": 1, "D": 2}
SPLITS = {"A": "train", "B": "train", "C": "test", "D": "train"}


def _groups():
  return {(g["level"], g["split"]): g for g in standard.build(RECORDS, LEVELS, SPLITS)["groups"]}


def test_task_rows_best_kernels_and_first_correct_turn():
  rows = {r["task_id"]: r for r in standard.task_rows(RECORDS, LEVELS, SPLITS)}
  assert rows["A"]["correct_kernels"] == 3 and rows["A"]["best_speedup"] == 2.5
  assert rows["A"]["best_speedup_compile"] == 1.6 and rows["A"]["first_correct_turn"] == 1
  assert rows["B"]["correct_kernels"] == 0 and rows["B"]["best_speedup"] == 0.0
  assert rows["B"]["first_correct_turn"] is None
  assert rows["C"]["best_speedup_compile"] is None  # Its only correct kernel has no compile timing.
  assert rows["D"]["first_correct_turn"] == 2


def test_fast_p_is_strict_and_counts_every_task_of_the_group():
  g = _groups()
  assert g[(1, "train")]["correct"] == 0.5
  assert [g[(1, "train")][f"fast_{p:g}"] for p in standard.FAST_PS] == [0.5, 0.5, 0.5, 0.5, 0.5]
  assert [g[(1, "train")][f"fast_{p:g}_compile"] for p in standard.FAST_PS] == [0.5, 0.5, 0.5, 0.5, 0.0]
  # C's best speedup is exactly 1.0: fast_1 needs more than 1.
  assert [g[(1, "test")][f"fast_{p:g}"] for p in standard.FAST_PS] == [1.0, 1.0, 0.0, 0.0, 0.0]
  assert g[(1, "test")]["fast_0_compile"] == 0.0 and g[(1, "test")]["compile_na"] == 1
  assert g[("all", "all")]["correct"] == 0.75
  assert g[("all", "all")]["fast_1"] == 0.25 and g[("all", "all")]["fast_0.5"] == 0.5


def test_geometric_means_over_correct_tasks():
  g = _groups()
  assert g[("all", "all")]["geomean_speedup"] == pytest.approx((2.5 * 1.0 * 0.25) ** (1 / 3))
  assert g[("all", "all")]["geomean_speedup_compile"] == pytest.approx(math.sqrt(1.6 * 0.1))
  assert g[(2, "train")]["geomean_speedup"] == pytest.approx(0.25)
  assert standard.group_summary([])["correct"] == 0.0
  assert standard.geomean([]) is None


def test_best_and_avg_at_k_per_turn():
  assert standard.build(RECORDS, LEVELS, SPLITS)["trajectories"] == 2
  assert _groups()[(1, "test")]["turns"][0]["correct_avg"] == 0.5  # C: 1 of its 2 trajectories.
  turns = _groups()[(1, "train")]["turns"]
  assert [t["turn"] for t in turns] == [1, 2]
  assert turns[0]["correct_best"] == 0.5 and turns[0]["correct_avg"] == 0.25
  assert turns[0]["perf_best"] == 0.25 and turns[0]["perf_avg"] == 0.125
  assert turns[1]["correct_best"] == 0.5 and turns[1]["correct_avg"] == 0.5
  assert turns[1]["perf_best"] == 1.25 and turns[1]["perf_avg"] == pytest.approx(0.925)


def test_write_markdown_csv_and_plot(tmp_path):
  paths = standard.write(standard.build(RECORDS, LEVELS, SPLITS), str(tmp_path), title="KernelBench",
                         source_commit="423217d", device="no GPU")
  assert all((tmp_path / p).is_file() for p in paths)
  md = (tmp_path / "standard_report.md").read_text()
  assert "Task source commit: 423217d. GPU: no GPU. 2 trajectories per task" in md
  assert "| all | all | 4 | 0 | 75.0% |" in md
  rows = list(csv.DictReader(open(tmp_path / "standard_tasks.csv")))
  assert [r["task_id"] for r in rows] == ["A", "B", "C", "D"]
  assert rows[2]["best_speedup_compile"] == "n/a" and rows[0]["best_speedup"] == "2.5"
  summary = {(r["level"], r["split"]): r for r in csv.DictReader(open(tmp_path / "standard_summary.csv"))}
  assert float(summary[("1", "test")]["fast_0.5"]) == 1.0 and summary[("1", "test")]["geomean_speedup_compile"] == "n/a"


def test_source_commit_from_git_folder_or_configured(tmp_path):
  kb = tmp_path / "KernelBench" / "KernelBench"
  kb.mkdir(parents=True)
  assert standard.source_commit(str(kb)) == "unknown"
  assert standard.source_commit(str(kb), "abc123") == "abc123"
  git = tmp_path / "KernelBench" / ".git"
  (git / "refs" / "heads").mkdir(parents=True)
  (git / "HEAD").write_text("ref: refs/heads/main\n")
  (git / "packed-refs").write_text("# pack-refs\n423217d0aa refs/heads/main\n")
  assert standard.source_commit(str(kb)) == "423217d0aa"
  (git / "refs" / "heads" / "main").write_text("feedbeef\n")
  assert standard.source_commit(str(kb)) == "feedbeef"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_source_commit_is_the_tracking_repositorys_never_an_enclosing_checkouts(tmp_path):
  """A KernelBench copy in an ignored folder of another checkout is 'unknown', not that checkout's commit."""
  def git(*args, cwd):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()
  outer = tmp_path / "project"
  (outer / ".kb" / "KernelBench" / "level1").mkdir(parents=True)
  (outer / ".kb" / "KernelBench" / "level1" / "1_Task.py").write_text("x = 1\n")
  (outer / ".gitignore").write_text("/.kb/\n")
  git("init", "-q", cwd=outer)
  git("add", ".gitignore", cwd=outer)
  git("commit", "-qm", "outer", cwd=outer)
  assert standard.source_commit(str(outer / ".kb" / "KernelBench")) == "unknown"
  kb = tmp_path / "kbrepo"
  (kb / "KernelBench" / "level1").mkdir(parents=True)
  (kb / "KernelBench" / "level1" / "1_Task.py").write_text("x = 1\n")
  git("init", "-q", cwd=kb)
  git("add", ".", cwd=kb)
  git("commit", "-qm", "kb", cwd=kb)
  head = git("rev-parse", "HEAD", cwd=kb)
  assert standard.source_commit(str(kb / "KernelBench")) == head
  assert standard.source_commit(str(kb / "KernelBench" / "level1" / "1_Task.py")) == head


def test_task_level_results_are_never_the_policys():
  """A task whose every kernel got a task-level result is not evaluated: left out of the shares, counted apart; in an
  evaluated task, a task-level kernel is counted apart, not among its kernels."""
  def lvl(task, traj, turn):
    r = _rec(task, traj, turn, "runtime_error")
    r["result"]["flags"] = ["evaluator_error", "task_too_large"]
    return r
  big = [lvl("E", 8, 0), lvl("E", 8, 1), lvl("E", 9, 0), lvl("E", 9, 1)]
  partial = [r for r in RECORDS if not (r["task_id"] == "B" and r["traj"] == 3 and r["turn"] == 1)] + [lvl("B", 3, 1)]
  report = standard.build(partial + big, {**LEVELS, "E": 1}, {**SPLITS, "E": "train"})
  g = {(x["level"], x["split"]): x for x in report["groups"]}
  base = _groups()
  for key in ((1, "train"), ("all", "all")):
    assert g[key]["not_evaluated"] == 1 and g[key]["tasks"] == base[key]["tasks"]
    for f in ["correct"] + [f"fast_{p:g}" for p in standard.FAST_PS] + ["geomean_speedup"]:
      assert g[key][f] == base[key][f], (key, f)
    assert g[key]["turns"] == base[key]["turns"]
  rows = {r["task_id"]: r for r in report["tasks"]}
  assert rows["E"]["evaluated"] is False and rows["E"]["task_level_kernels"] == 4 and rows["E"]["kernels"] == 0
  assert rows["B"]["kernels"] == 3 and rows["B"]["task_level_kernels"] == 1
