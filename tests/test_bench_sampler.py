"""experiments/bench_sampler.py: variants side by side (parsing, alternation, another tree's bench, the ratio
table), --kernel-opts, the profile's decode-only arithmetic; and (slow) a real smoke run with two variants."""

import json
import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments import bench_sampler  # pylint: disable=g-import-not-at-top,wrong-import-position
from experiments import bench_sampler_workers as workers  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_kernel_opts_parse_and_rebind(monkeypatch):
  """--kernel-opts: module.function:key=value,...; ';' between kernels; integers become ints. Applying rebinds the
  function on its module (restored here by monkeypatch), which the model looks up when it traces a decode step."""
  from kevin_jax.policy.decode import attention as decode_attention  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy.decode import mlp as decode_mlp  # pylint: disable=g-import-not-at-top
  spec = "decode_mlp.swiglu_front:num_stages=5,block_n=32; attention.decode_attention:balance=0"
  assert workers.parse_kernel_opts(spec) == [
      ("mlp", "swiglu_front", {"num_stages": 5, "block_n": 32}),
      ("attention", "decode_attention", {"balance": 0})]
  assert workers.parse_kernel_opts("") == []
  for bad in ("decode_mlp:num_stages=5", "decode_mlp.swiglu_front", "decode_mlp.swiglu_front:num_stages"):
    with pytest.raises(ValueError, match="--kernel-opts"):
      workers.parse_kernel_opts(bad)
  originals = (decode_mlp.swiglu_front, decode_attention.decode_attention)
  monkeypatch.setattr(decode_mlp, "swiglu_front", originals[0])
  monkeypatch.setattr(decode_attention, "decode_attention", originals[1])
  workers.apply_kernel_opts(spec)
  assert decode_mlp.swiglu_front.func is originals[0]
  assert decode_mlp.swiglu_front.keywords == {"num_stages": 5, "block_n": 32}
  assert decode_attention.decode_attention.keywords == {"balance": 0}


def _fake_tree(root, tok_s: float):
  """A tree whose experiments/bench_sampler.py writes bench_sampler's results.json (one run per batch at tok_s)
  and records its argv and working directory."""
  os.makedirs(root / "experiments")
  (root / "experiments" / "bench_sampler.py").write_text(textwrap.dedent(f"""
      import json, os, sys
      a = sys.argv[1:]
      out, batches = a[a.index("--out") + 1], a[a.index("--batches") + 1].split(",")
      runs = [{{"batch": int(b), "decode_tok_s": {tok_s} * int(b), "roofline_frac": 0.25}} for b in batches]
      models = {{m: {{"jax": {{"runs": runs}}}} for m in a[a.index("--models") + 1].split(",")}}
      json.dump({{"argv": a, "cwd": os.getcwd(), "models": models}},
                open(os.path.join(out, "results.json"), "w"))
      """))


def test_parse_variant(tmp_path):
  v = bench_sampler.parse_variant("fused:--decode-out xla --kernel-opts=decode_mlp.swiglu_front:num_stages=3")
  assert (v.name, v.tree) == ("fused", None)
  assert v.options == {"decode_out": "xla", "kernel_opts": "decode_mlp.swiglu_front:num_stages=3"}
  assert bench_sampler.parse_variant("new:").options == {}
  assert bench_sampler.parse_variant("pdl:--xla-flags=--xla_gpu_enable_pdl=true").options == {
      "xla_flags": "--xla_gpu_enable_pdl=true"}
  _fake_tree(tmp_path / "base", 1.0)
  for spec in (f"base:--tree {tmp_path / 'base'} --decode-norm inside",
               f"base:--tree={tmp_path / 'base'} --decode-norm inside"):
    t = bench_sampler.parse_variant(spec)
    assert t.tree == str(tmp_path / "base") and t.tree_args == ("--decode-norm", "inside") and t.options == {}
  for spec, match in (("nocolon", "NAME:FLAGS"), ("a b:", "NAME:FLAGS"), ("x:--decode-qkv sideways", "invalid"),
                      ("x:--models 1.5b", "unknown flags"), (f"x:--tree {tmp_path}", "no experiments/bench_")):
    with pytest.raises(ValueError, match=match):
      bench_sampler.parse_variant(spec)
  with pytest.raises(SystemExit, match="names must differ"):
    bench_sampler.main(["--out", str(tmp_path / "o"), "--variant", "a:", "--variant", "a:--decode-out xla"])


def test_variants_alternate_and_compare(tmp_path, monkeypatch):
  """Rounds alternate the variants (A B A B); each run gets its variant's options on top of the command's and its
  own folder; transformers only with the first variant's first round; the table's means and ratios (a failed run
  shows as such), and another tree's bench with the shapes and its own flags, its imports from that tree."""
  calls = []
  speed = {("new", 1): 45000.0, ("new", 2): 47000.0, ("fused", 1): 48000.0}  # fused round 2 fails

  def fake_run_once(args, out_dir, t0):
    del t0
    name, rnd = os.path.basename(out_dir).rsplit("_r", 1)
    calls.append((name, int(rnd), args.decode_out, args.decode_norm, args.no_hf))
    tok_s = speed.get((name, int(rnd)))
    jax = {"runs": [{"batch": 64, "decode_tok_s": tok_s, "roofline_frac": tok_s / 1e5}]} if tok_s else {
        "error": "rc=1"}
    return {"models": {"0.5b": {"jax": jax}}}

  monkeypatch.setattr(bench_sampler, "run_once", fake_run_once)
  _fake_tree(tmp_path / "base", 700.0)
  out = tmp_path / "ab"
  bench_sampler.main(["--models", "0.5b", "--batches", "64", "--decode-norm", "xla", "--rounds", "2", "--out",
                      str(out), "--variant", "new:", "--variant", "fused:--decode-out xla --decode-norm inside",
                      "--variant", f"base:--tree {tmp_path / 'base'} --decode-mlp pallas"])
  assert calls == [("new", 1, "auto", "xla", False), ("fused", 1, "xla", "inside", True),
                   ("new", 2, "auto", "xla", True), ("fused", 2, "xla", "inside", True)]
  summary = json.loads((out / "variants.json").read_text())
  assert [(r["variant"], r["round"]) for r in summary["runs"]] == [
      ("new", 1), ("fused", 1), ("base", 1), ("new", 2), ("fused", 2), ("base", 2)]
  assert summary["runs"][4]["errors"] == ["0.5b jax: rc=1"]
  tree_run = json.loads((out / "base_r1" / "results.json").read_text())
  assert tree_run["cwd"] == str(tmp_path / "base")
  assert tree_run["argv"] == ["--models", "0.5b", "--batches", "64", "--prompt-len", "1024", "--new-tokens", "1024",
                              "--seed", "0", "--no-hf", "--out", str(out / "base_r1"), "--decode-mlp", "pallas"]
  lines = (out / "variants.md").read_text().splitlines()
  assert lines[4] == "| new | 0.5b | 64 | 45,000 / 47,000 | 46,000 | 1.000 | 46.0 % | - |"
  assert lines[5] == ("| fused | 0.5b | 64 | 48,000 / failed | 48,000 | 1.043 | 48.0 % | --decode-out xla "
                      "--decode-norm inside |")
  assert lines[6] == (f"| base | 0.5b | 64 | 44,800 / 44,800 | 44,800 | 0.974 | 25.0 % | --tree {tmp_path / 'base'} "
                      "--decode-mlp pallas |")


def test_decode_only_subtracts_the_prefill_call_per_step():
  # A call of 255 decode steps: 200 ms of matmuls, 40 ms of them the prefill's; attention only while decoding; a
  # class that only the prefill-only call has comes out negative.
  full = {"matmul": 200.0, "attention": 51.0, "fusion": 30.0}
  prefill = {"matmul": 40.0, "fusion": 4.5, "copy": 2.55}
  got = workers.decode_only(full, prefill, 255)
  assert got == pytest.approx({"matmul": 160 / 255, "attention": 0.2, "fusion": 0.1, "copy": -0.01})
  with pytest.raises(ValueError, match="decode steps"):
    workers.decode_only(full, prefill, 0)


@pytest.mark.slow
def test_smoke_two_variants_end_to_end(tmp_path):
  """The real workers on tiny shapes (CPU): both variants decode every row to full length with finite log-probs,
  the decode HLO holds no copy of the KV cache, and the table compares them."""
  out = tmp_path / "smoke"
  bench_sampler.main(["--smoke", "--no-hf", "--batches", "2", "--out", str(out), "--variant", "a:",
                      "--variant", "b:--decode-out xla --kernel-opts decode_mlp.swiglu_front:num_stages=3"])
  for name in ("a_r1", "b_r1"):
    res = json.loads((out / name / "results.json").read_text())
    jax = res["models"]["tiny"]["jax"]
    (run,) = jax["runs"]
    assert run["batch"] == 2 and run["decode_steps"] == 15 and run["decode_tok_s"] > 0
    assert run["all_full_length"] and run["logprobs_finite_nonpositive"] and 0 < run["roofline_frac"]
    assert jax["cache_ops_in_decode_hlo"]["files"] > 0
    assert (jax["cache_ops_in_decode_hlo"]["copy"], jax["cache_ops_in_decode_hlo"]["transpose"]) == (0, 0)
  assert json.loads((out / "b_r1" / "results.json").read_text())["args"]["decode_out"] == "xla"
  rows = json.loads((out / "variants.json").read_text())["rows"]
  assert [r["variant"] for r in rows] == ["a", "b"] and rows[0]["vs_first"] == 1.0 and rows[1]["vs_first"] > 0
