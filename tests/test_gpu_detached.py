"""experiments/gpu_detached.sh: a detached job outlives the call that started it, a later call collects it."""

import os
import subprocess
import tarfile

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "gpu_detached.sh")


def _call(args, tmp_path, out, **env):
  env = dict(os.environ, OUT=str(out), DETACHED_ROOT=str(tmp_path / "detached"), **env)
  return subprocess.run(["bash", SCRIPT, *args], cwd=tmp_path / "checkout", env=env, capture_output=True,
                        text=True, timeout=120)


@pytest.fixture
def checkout(tmp_path):
  (tmp_path / "checkout").mkdir()
  (tmp_path / "checkout" / "marker.txt").write_text("from the checkout\n")
  return tmp_path


def test_start_returns_while_running_and_wait_collects_the_workdir(checkout):
  tmp = checkout
  # The job copies a file of the checkout into its workdir only after a flag file appears, so the first call
  # must return while it is still running.
  flag = tmp / "go"
  cmd = (f"while [ ! -e {flag} ]; do sleep 0.2; done; cp marker.txt $WORKDIR/; mkdir $WORKDIR/hf; "
         "echo weights > $WORKDIR/hf/w.bin; echo done")
  r = _call(["start", "j", "1", cmd], tmp, tmp / "out1")
  assert r.returncode == 0, r.stderr
  assert "still running" in r.stdout and not (tmp / "out1" / "status.txt").exists()
  assert (tmp / "detached" / "j" / "src" / "marker.txt").is_file()  # Runs from its own copy.

  flag.write_text("")
  r = _call(["wait", "j", "30"], tmp, tmp / "out2", KEEP="hf")
  assert r.returncode == 0, r.stderr
  assert "ended with rc=0" in r.stdout
  assert (tmp / "out2" / "status.txt").read_text().startswith("rc=0 ")
  assert "done" in (tmp / "out2" / "job.log").read_text()
  with tarfile.open(tmp / "out2" / "j.tar.gz") as t:
    names = t.getnames()
    assert "work/marker.txt" in names
    assert t.extractfile("work/marker.txt").read() == b"from the checkout\n"
  parts = sorted(p for p in os.listdir(tmp / "out2") if p.startswith("keep.tgz.part"))
  assert parts == ["keep.tgz.part00"]
  with tarfile.open(tmp / "out2" / parts[0], "r:gz") as t:  # KEEP's directory, gzipped.
    assert t.extractfile("./w.bin").read() == b"weights\n"


def test_failing_job_reports_its_exit_status(checkout):
  r = _call(["start", "bad", "30", "echo oops >&2; exit 7"], checkout, checkout / "out")
  assert r.returncode == 0, r.stderr
  assert "ended with rc=7" in r.stdout and "oops" in (checkout / "out" / "job.log").read_text()


def test_refuses_a_second_start_and_an_unknown_job(checkout):
  assert _call(["start", "once", "5", "true"], checkout, checkout / "out").returncode == 0
  again = _call(["start", "once", "5", "true"], checkout, checkout / "out")
  assert again.returncode == 2 and "exists" in again.stderr
  lost = _call(["wait", "never-started", "1"], checkout, checkout / "out")
  assert lost.returncode == 3 and "was lost" in lost.stderr
  bad = _call(["run", "x", "1"], checkout, checkout / "out")
  assert bad.returncode == 2 and "start or wait" in bad.stderr
