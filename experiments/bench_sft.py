"""The supervised warm start on one GPU: SFT-step throughput/MFU, then the real default SFT job, timed.

  python experiments/bench_sft.py --out runs/bench_sft          # one H200: ~5-7 minutes (budget guard 570 s)

Stage 1 (`--stage step`, a subprocess): `SFTStep` (kevin_jax/rl/sft_step.py) for the embedded 'small' preset
(bf16 params + fp32 master, bf16 compute) at the default batch (sft.batch_size rows, sft.micro_batch_size per
micro-batch), for cudnn and xla attention at --seq-lens: compile time, temp memory, median step time, tokens/s,
MFU. FLOPs per token = 3 x (2 * N_mm + 2 * L * T * N * H) (fwd + bwd, attention over the causal half, LM head
counted; rl/learner benchmark convention); peak 989 TFLOP/s (H200 dense bf16 datasheet).
Stage 2 (`--stage run`, a subprocess): `python -m kevin_jax.main --config=configs/sft.py --workdir=OUT/run`
with --run-overrides, killed at the remaining budget (rerunning the same command resumes it); reports wall time,
steps, time to the first step (compiles), final train/eval/held-out-task loss and token accuracy, the greedy
samples' parse and EOS rates, and tokens/s. Writes OUT/bench_sft.{json,md}; prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PEAK = 989e12  # H200 SXM dense bf16, FLOP/s.


def step_bench(seq_len: int, attention: str, steps: int) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from configs import sft as sft_config  # pylint: disable=g-import-not-at-top
  from kevin_jax import runtime, sft  # pylint: disable=g-import-not-at-top
  from kevin_jax.rl.sft_step import SFTBatch, check_finite  # pylint: disable=g-import-not-at-top

  config = sft_config.get_config()
  config.policy.attention_impl = attention
  config.sft.max_seq_len = max(seq_len, config.sft.max_seq_len)
  policy, step = sft.build_sft(config, runtime.build_policy(config), 1000)
  cfg = policy.model_cfg
  b = config.sft.batch_size
  rng = np.random.default_rng(0)
  prompt = seq_len * 2 // 3  # Bundled examples: ~1.7k prompt + ~0.9k response tokens.
  batch = SFTBatch(rng.integers(3, cfg.vocab_size, (b, seq_len)).astype(np.int32), np.ones((b, seq_len), np.int32),
                   (np.arange(seq_len)[None] >= prompt).repeat(b, 0).astype(np.float32))
  t0 = time.time()
  compiled = step.compile(b, seq_len)
  compile_s = time.time() - t0
  mem = compiled.memory_analysis()
  state = policy.learner.init_state(jax.random.key(0))
  times = []
  for i in range(steps + 1):
    dev = step.put_batch(batch)
    jax.block_until_ready(dev)
    t0 = time.perf_counter()
    state, m = compiled(state, dev)
    jax.block_until_ready((state, m))
    if i:
      times.append(time.perf_counter() - t0)
    check_finite(jax.device_get(m), i + 1)
  d, f, n, k, h, v, l = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                         cfg.vocab_size, cfg.num_layers)
  n_mm = l * (d * (n + 2 * k) * h + n * h * d + 3 * d * f) + d * v
  flops = b * seq_len * 3 * (2 * n_mm + 2 * l * seq_len * n * h)
  step_s = statistics.median(times)
  return {"stage": "step", "attention": attention, "seq_len": seq_len, "rows": b,
          "micro_batch": config.sft.micro_batch_size, "params": cfg.num_params(), "compile_s": round(compile_s, 1),
          "step_s": round(step_s, 4), "tokens_per_s": b * seq_len / step_s, "mfu": flops / step_s / PEAK,
          "temp_gib": mem.temp_size_in_bytes / 2**30, "loss": float(m["loss"])}


def run_stage(out: str, config: str, overrides: list[str], timeout_s: float) -> dict:
  workdir = os.path.join(out, "run")
  cmd = [sys.executable, "-m", "kevin_jax.main", f"--config={config}", f"--workdir={workdir}"] + overrides
  t0 = time.time()
  with open(os.path.join(out, "run.log"), "w") as log:
    try:
      rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s).returncode
    except subprocess.TimeoutExpired:
      rc = "timeout"
  wall = time.time() - t0
  r = {"stage": "run", "command": " ".join(cmd[1:]), "rc": rc, "wall_s": round(wall, 1)}
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.isfile(path):
    return r
  from kevin_jax.metrics import read_metrics  # pylint: disable=g-import-not-at-top
  recs = read_metrics(path)
  last = recs[max(recs)]
  evals = [s for s in recs if "eval/loss" in recs[s] or "heldout_tasks/loss" in recs[s]]
  ev = recs[evals[-1]] if evals else {}
  data = json.load(open(os.path.join(workdir, "sft_data.json")))
  r.update(steps=max(recs), total_steps=data["total_steps"], train_examples=data["train"],
           first_step_s=round(recs[min(recs)]["perf/step_s"], 1),
           train_tokens_per_s=statistics.median(x["perf/tokens_per_s"] for x in recs.values()),
           eval_s_total=round(sum(x.get("perf/eval_s", 0.0) for x in recs.values()), 1),
           loss_first=recs[min(recs)]["train/loss"], loss_last=last["train/loss"],
           acc_last=last["train/token_acc"], eval_step=evals[-1] if evals else None,
           eval_loss=ev.get("eval/loss"), eval_acc=ev.get("eval/token_acc"),
           heldout_tasks_loss=ev.get("heldout_tasks/loss"), parse_rate=ev.get("sample/parse_rate"),
           eos_rate=ev.get("sample/eos_rate"), hf_exported=os.path.isfile(os.path.join(workdir, "hf", "config.json")),
           corpus=data)
  return r


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", default=os.environ.get("OUT", "bench_sft_out"))
  p.add_argument("--stage", default="all", choices=("all", "step", "run"))
  p.add_argument("--seq-lens", default="3072,5120")
  p.add_argument("--attention", default="cudnn,xla")
  p.add_argument("--steps", type=int, default=5, help="timed steps after a warm-up step (stage 1)")
  p.add_argument("--config", default="configs/sft.py", help="config of stage 2 (e.g. configs/sft.py:runlocal)")
  p.add_argument("--run-overrides", default="", help="space-separated --config.x=y flags for stage 2")
  p.add_argument("--budget-s", type=float, default=570.0, help="wall-clock budget of the whole script")
  a = p.parse_args()
  os.makedirs(a.out, exist_ok=True)
  if a.stage == "step":
    for attention in a.attention.split(","):
      for t in (int(x) for x in a.seq_lens.split(",")):
        try:
          r = step_bench(t, attention, a.steps)
        except Exception as e:  # pylint: disable=broad-except  (an OOM of the xla path is a result too)
          r = {"stage": "step", "attention": attention, "seq_len": t, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        print("RESULT " + json.dumps(r), flush=True)
    return 0
  t_start = time.time()
  results = []
  if a.stage == "all":
    cmd = [sys.executable, __file__, "--stage", "step", "--out", a.out, "--seq-lens", a.seq_lens,
           "--attention", a.attention, "--steps", str(a.steps)]
    try:
      proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=min(240, a.budget_s / 2))
      out = proc.stdout
      open(os.path.join(a.out, "step.log"), "w").write(proc.stdout + proc.stderr)
    except subprocess.TimeoutExpired as e:
      out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
    results += [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
  remaining = a.budget_s - (time.time() - t_start)
  results.append(run_stage(a.out, a.config, a.run_overrides.split(), max(30.0, remaining)))
  summary = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": " ".join(sys.argv), "results": results}
  json.dump(summary, open(os.path.join(a.out, "bench_sft.json"), "w"), indent=1)
  lines = ["| attention | seq | rows x micro | compile s | step s | tokens/s | MFU | temp GiB |", "|---" * 8 + "|"]
  for r in results:
    if r["stage"] == "step":
      lines.append(f"| {r['attention']} | {r['seq_len']} | " + (f"error: {r['error'][:90]} |" if "error" in r else
                   f"{r['rows']} x {r['micro_batch']} | {r['compile_s']} | {r['step_s']:.3f} | "
                   f"{r['tokens_per_s']:,.0f} | {r['mfu']:.1%} | {r['temp_gib']:.1f} |"))
  run = results[-1]
  lines += ["", "| SFT job | value |", "|---|---|"]
  for key in ("rc", "wall_s", "steps", "total_steps", "train_examples", "first_step_s", "train_tokens_per_s",
              "eval_s_total", "loss_first", "loss_last", "acc_last", "eval_step", "eval_loss", "eval_acc",
              "heldout_tasks_loss", "parse_rate", "eos_rate", "hf_exported"):
    v = run.get(key)
    lines.append(f"| {key} | {v:.4g} |" if isinstance(v, float) else f"| {key} | {v} |")
  md = f"# SFT benchmark\n\n{summary['date']}\n\nCommand: `{summary['command']}`\n\n" + "\n".join(lines) + "\n"
  open(os.path.join(a.out, "bench_sft.md"), "w").write(md)
  print("\n".join(lines))
  return 0 if run.get("rc") == 0 else 1


if __name__ == "__main__":
  sys.exit(main())
