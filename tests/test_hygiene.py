"""Task hygiene (kernels/hygiene.py) on small KernelBench-format fixture tasks written here, on the CPU."""

import os

import pytest
import torch

from kevin_jax.kernels import footprint, hygiene, taskinfo, tasks

HEAD = "import torch\nimport torch.nn as nn\n"
TAIL = """
def get_inputs():
    return [torch.rand(batch_size, {d})]

def get_init_inputs():
    return []
"""

FIXTURES = {
    "zeros": ("class Model(nn.Module):\n    def forward(self, x):\n"
              "        return x.amax(1, keepdim=True) - x.amax(1, keepdim=True)\n"),
    "constant": "class Model(nn.Module):\n    def forward(self, x):\n        return torch.full_like(x, 2.5) + 0 * x\n",
    "input_copy": "class Model(nn.Module):\n    def forward(self, x):\n        return x.clone()\n",
    "relu": "class Model(nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n",
    "broadcast_copy": ("class Model(nn.Module):\n    def forward(self, x):\n"  # x: [batch, 1]
                       "        return x.expand(-1, 8).contiguous()\n", 1),
    "bias_only": ("class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                  "        self.bias = nn.Parameter(torch.randn(1, 8))\n"
                  "    def forward(self, x):\n        return torch.relu(-x.abs() - 1) + self.bias\n"),
    "below_tolerance": "class Model(nn.Module):\n    def forward(self, x):\n        return x * 1e-6\n",
    "random": "class Model(nn.Module):\n    def forward(self, x):\n        return x + torch.rand_like(x)\n",
    "dropout": ("class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                "        self.fc = nn.Linear(8, 8)\n        self.drop = nn.Dropout(0.5)\n"
                "    def forward(self, x):\n        return torch.softmax(self.drop(self.fc(x)), dim=1)\n"),
    "batchnorm": ("class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                  "        self.bn = nn.BatchNorm1d(8)\n        self.bn.running_mean.fill_(0.5)\n"
                  "        self.bn.running_var.fill_(2.0)\n"
                  "    def forward(self, x):\n        return self.bn(x)\n"),
    "batchnorm_fresh": ("class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                        "        self.bn = nn.BatchNorm1d(8)\n"
                        "    def forward(self, x):\n        return self.bn(x)\n"),
    "healthy": ("class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                "        self.fc = nn.Linear(8, 8)\n"
                "    def forward(self, x):\n        return self.fc(x)\n"),
    "broken": "import not_a_package_kevin_jax\nclass Model(nn.Module):\n    pass\n",
}


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
  root = tmp_path_factory.mktemp("hygiene_tasks")
  for name, body in FIXTURES.items():
    body, width = body if isinstance(body, tuple) else (body, 8)
    (root / f"{name}.py").write_text(HEAD + body + "\nbatch_size = 64\n" + TAIL.format(d=width))
  return {s.id: s for s in tasks.discover(str(root))}


@pytest.fixture(scope="module")
def report(specs):
  return {r.task_id: r for r in hygiene.hygiene_report(list(specs.values()), "cpu")}


@pytest.mark.parametrize("name,needle", [
    ("zeros", "all zeros"), ("constant", "the constant 2.5"), ("input_copy", "wrapped copy of input 0"),
    ("broadcast_copy", "broadcast copy of input 0"), ("bias_only", "copy of parameter 'bias'"),
    ("below_tolerance", "all zeros"), ("random", "non-deterministic"), ("broken", "fails to import")])
def test_degenerate_random_and_broken_tasks_are_excluded(report, name, needle):
  r = report[name]
  assert r.verdict == "excluded", r
  assert any(needle in reason for reason in r.reasons), r.reasons


def test_degenerate_reasons_name_every_distribution(report):
  reason = next(x for x in report["zeros"].reasons if x.startswith("degenerate"))
  for d in hygiene.DEFAULT_DISTRIBUTIONS:
    assert d in reason
  assert report["zeros"].stats[0]["zeros"] == 1.0


def test_a_copy_on_the_task_distribution_alone_is_not_degenerate(report):
  """relu(x) equals x on torch.rand inputs but not on N(0, 1): no single trivial kernel passes every trial."""
  r = report["relu"]
  assert r.stats[0]["copy"] == 1.0
  assert r.verdict == "ok", r


def test_dropout_is_flagged_and_switched_off(report):
  r = report["dropout"]
  assert r.verdict == "flagged", r
  assert any("Dropout" in x and "dropout off" in x for x in r.reasons), r.reasons
  assert not any("non-deterministic" in x for x in r.reasons)


def test_batchnorm_normalises_with_batch_statistics(report):
  """The reference mode keeps BatchNorm as built (training mode, as KernelBench runs it): its running statistics
  do not enter, so a fresh BatchNorm is not a copy of its input. Its affine weights start at 1 and 0 whatever the
  seed, so the one flag is that outputs do not change with the weight draw."""
  for name in ("batchnorm", "batchnorm_fresh"):
    r = report[name]
    assert r.verdict == "flagged" and r.reasons == ["out0: only 0.00% of the elements change with the weights"], (
        name, r.reasons)
  torch.manual_seed(0)
  bn = taskinfo.as_reference(torch.nn.BatchNorm1d(8))
  bn.running_mean.fill_(0.5)
  x = torch.randn(16, 8) * 3 + 2
  want = (x - x.mean(0)) / torch.sqrt(x.var(0, unbiased=False) + bn.eps)
  with torch.no_grad():
    got = bn(x)
  assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
  drop = taskinfo.as_reference(torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.BatchNorm1d(8)))
  assert not drop[0].training and drop[1].training


def test_healthy_task_is_ok_with_its_footprint(report):
  r = report["healthy"]
  assert r.verdict == "ok" and r.reasons == [] and r.device == "cpu"
  assert (r.input_bytes, r.output_bytes, r.param_bytes) == (64 * 8 * 4, 64 * 8 * 4, (64 + 8) * 4)
  # 3 P + max(3 I + 3 O + W, 2 I + 5 O, 3 S I + 2 O + W) with S = 2, W = max(I, O): the timing phase.
  assert r.evaluation_bytes == 3 * 288 + 6 * 2048 + 2 * 2048 + 2048
  assert r.stats[0]["zeros"] < 0.01 and r.stats[0]["varying"] > 0.9


def test_large_task_runs_at_a_reduced_batch_or_is_reported_unchecked(tmp_path):
  body = FIXTURES["healthy"]
  (tmp_path / "big_batch.py").write_text(HEAD + body + "\nbatch_size = 1 << 20\n" + TAIL.format(d=8))
  (tmp_path / "no_batch.py").write_text(HEAD + body + "\nrows = 1 << 20\n" + TAIL.format(d=8).replace(
      "batch_size", "rows"))
  got = {r.task_id: r for r in hygiene.hygiene_report(tasks.discover(str(tmp_path)), "cpu", max_bytes=1 << 20)}
  big = got["big_batch"]
  assert big.verdict == "ok" and big.reduced.startswith("batch_size 1048576 -> ")
  assert big.input_bytes == (1 << 20) * 8 * 4  # The footprint is the task's own, not the reduced one.
  small = int(big.reduced.rsplit(" ", 1)[1])
  assert 1 <= small and hygiene.hygiene_bytes(footprint.TaskBytes(small * 32, small * 32, 288)) <= 1 << 20
  assert got["no_batch"].verdict == "flagged" and not got["no_batch"].checked
  assert "not checked on cpu" in got["no_batch"].reasons[0]


def test_records_are_cached_by_source_hash(specs, tmp_path, monkeypatch):
  chosen = [specs["zeros"], specs["healthy"]]
  first = hygiene.hygiene_report(chosen, "cpu", cache_dir=str(tmp_path))
  assert len(os.listdir(tmp_path)) == 2
  monkeypatch.setattr(hygiene, "check_task", lambda *a, **k: pytest.fail("not answered from the cache"))
  again = hygiene.hygiene_report(chosen, "cpu", cache_dir=str(tmp_path))
  assert [r.to_dict() for r in again] == [r.to_dict() for r in first]
  other = hygiene.settings_key(1e-3, 1e-3, hygiene.DEFAULT_DISTRIBUTIONS)
  assert hygiene.cached(chosen, str(tmp_path), other) == {}  # Other tolerances: checked again.


def test_report_files(report, tmp_path):
  md, csv_path = hygiene.write_report(list(report.values()), str(tmp_path))
  text = open(md, encoding="utf-8").read()
  assert "| zeros | excluded |" in text and "| healthy |" not in text
  rows = open(csv_path, encoding="utf-8").read().splitlines()
  assert rows[0].startswith("task_id,verdict") and len(rows) == 1 + len(FIXTURES)


def test_memory_budget():
  info = {"inputs": [{"kind": "tensor", "shape": [1024, 1024], "dtype": "float32"}, {"kind": "scalar", "value": 3}],
          "outputs": [{"shape": [1024, 1024], "dtype": "float32"}],
          "params": {"w": {"shape": [10], "dtype": "float16"}}}
  b = footprint.task_bytes(info)
  assert (b.inputs, b.outputs, b.params) == (4 << 20, 4 << 20, 20)
  need = 3 * 20 + 6 * (4 << 20) + 2 * (4 << 20) + (4 << 20)  # The timing phase (footprint.py).
  assert footprint.evaluation_bytes(info) == need
  many_outputs = dict(info, outputs=[{"shape": [4096, 1024], "dtype": "float32"}])  # O = 4 I: the comparison phase.
  assert footprint.evaluation_bytes(many_outputs) == 3 * 20 + 2 * (4 << 20) + 5 * (16 << 20)
  no_timing_heavy = dict(info, inputs=[])  # I = 0: the reference phase, 3 O + W.
  assert footprint.evaluation_bytes(no_timing_heavy) == 3 * 20 + 5 * (4 << 20)
  assert hygiene.memory_budget_ok(info, free_bytes=need, fraction=1.0)
  assert not hygiene.memory_budget_ok(info, free_bytes=need, fraction=0.8)
  assert hygiene.memory_budget_ok(info, free_bytes=0, fraction=0.0)  # No budget.
  r = footprint.too_large_result("t", info, free_bytes=need, fraction=0.5)
  assert r["flags"] == ["task_too_large", "evaluator_error"] and "too large" in r["error"]
  assert footprint.too_large_result("t", info, free_bytes=2 * need, fraction=0.5) is None


def test_checks_on_a_device_give_the_cpu_verdicts(specs, report):
  """The checks on a second device (emulated on the CPU: mixing it with CPU tensors raises as CUDA does) agree
  with the CPU run, task by task: no check builds a CPU tensor that meets the device's outputs."""
  from emulated_device import on_emulated_device  # pylint: disable=g-import-not-at-top
  with on_emulated_device() as dev:
    on_dev = {r.task_id: r for r in hygiene.hygiene_report(list(specs.values()), str(dev),
                                                           max_bytes=hygiene.CPU_MAX_BYTES)}
  for tid, r in report.items():
    got = on_dev[tid]
    assert (got.verdict, got.reasons) == (r.verdict, r.reasons), (tid, got.reasons)
    assert got.device == (str(dev) if r.device else ""), tid


def test_gpu_limit_counts_what_the_allocator_caches(monkeypatch):
  """Half of free + cached-but-unused memory: earlier tasks' freed tensors stay in torch's cache, not lost."""
  monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (22 << 30, 80 << 30))
  monkeypatch.setattr(torch.cuda, "memory_reserved", lambda *a: 56 << 30)
  monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 2 << 30)
  assert hygiene.default_max_bytes("cuda") == 38 << 30
  assert hygiene.default_max_bytes("cpu") == hygiene.CPU_MAX_BYTES
