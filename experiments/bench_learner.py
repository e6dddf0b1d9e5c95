"""Learner-step throughput and MFU for Qwen2.5-0.5B- and 1.5B-shaped random models (bf16, 4k-token samples).

  python experiments/bench_learner.py --out runs/bench_learner      # one H200: ~3-4 minutes with compiles
  python experiments/bench_learner.py --lowered-digest --attention xla --seq-len 512   # any machine, no GPU

`--lowered-digest` lowers the step for abstract inputs (nothing compiled, allocated or run) and prints a digest of
its StableHLO text without source locations: two trees with equal digests run the same learner program.

What is timed: `Learner.step` (kevin_jax/rl/learner.py) end to end on a rollout batch of `rows` samples of
`seq_len` tokens: the forward-only recompute of old log-probs, then `updates_per_batch` = 2 optimizer updates,
each over `accum` micro-batches of `micro_batch` samples with gradient accumulation, global-norm clipping and
AdamW on an fp32 master copy of the bf16 parameters. Median of --steps steps after one compile/warm-up step.

FLOP count (model FLOPs; recomputation by remat is not counted):
  N_mm        = L * (D*(N+2K)*H + N*H*D + 3*D*F) + D*V          matmul parameters (LM head counted even if tied)
  fwd / token = 2*N_mm + 2*L*T*N*H                              attention QK^T and PV over the causal half
  step FLOPs  = rows * T * fwd * (3 + 1)                        fwd+bwd of every sample once (3x fwd), plus the
                                                                forward recompute of old log-probs (1x fwd)
  MFU         = step FLOPs / step time / peak;  peak = 989 TFLOP/s (H200 dense bf16 datasheet), also reported
                against the 808 TFLOP/s measured 8192^3 bf16 matmul ceiling of an H200.
  `mfu_palm` counts attention over the full T x T (PaLM/MaxText convention: 4*L*T*N*H per token forward),
  which flash kernels with a causal mask do not execute; it is reported for comparison only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PEAK_DATASHEET = 989e12  # H200 SXM dense bf16, FLOP/s.
PEAK_MEASURED = 808e12  # bf16 8192^3 matmul through JAX on an H200, FLOP/s (BENCHMARKS.md "Learner step").


def flops_per_token(cfg, seq_len: int, *, full_attention: bool = False) -> tuple[float, float]:
  """(forward FLOPs per token, N_mm) for a Qwen2 ModelConfig at sequence length seq_len."""
  d, f, n, k, h, v, l = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                         cfg.vocab_size, cfg.num_layers)
  n_mm = l * (d * (n + 2 * k) * h + n * h * d + 3 * d * f) + d * v
  attn = (4 if full_attention else 2) * l * seq_len * n * h
  return 2 * n_mm + attn, n_mm


def lowered_digest(preset: str, args, mesh) -> dict:
  """sha256 of the step's StableHLO for abstract inputs, source locations removed (module docstring)."""
  import hashlib  # pylint: disable=g-import-not-at-top
  import re  # pylint: disable=g-import-not-at-top
  learner, model_cfg = _learner(preset, args, mesh)
  rows = learner.rows_multiple() * args.accum
  text = learner.lowered(rows, args.seq_len).as_text()
  text = re.sub(r"#loc\d*|loc\([^)]*\)", "", text)
  return {"preset": preset, "params": model_cfg.num_params(), "scan_layers": args.scan_layers,
          "attention": args.attention, "seq_len": args.seq_len, "rows": rows, "chars": len(text),
          "sha256": hashlib.sha256(text.encode()).hexdigest()}


def _learner(preset: str, args, mesh):
  from configs import multiturn  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy.config import get_preset  # pylint: disable=g-import-not-at-top
  from kevin_jax.rl.learner import Learner  # pylint: disable=g-import-not-at-top
  config = multiturn.get_config()
  config.rl.micro_batch_size = args.micro_batch.get(preset, 4)
  config.rl.scan_layers = bool(args.scan_layers)
  config.rl.logits_chunk = args.logits_chunk
  config.rl.loss_constant = float(args.seq_len)
  model_cfg = get_preset(preset, param_dtype="bfloat16", compute_dtype="bfloat16", remat=args.remat,
                         attention_impl=args.attention)
  return Learner.from_config(config, mesh, model_cfg=model_cfg), model_cfg


def bench_one(preset: str, args, mesh) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from kevin_jax.rl.learner import TrainBatch, check_finite  # pylint: disable=g-import-not-at-top

  mb = args.micro_batch.get(preset, 4)
  learner, model_cfg = _learner(preset, args, mesh)
  rows = learner.rows_multiple() * args.accum
  t = args.seq_len
  rng = np.random.default_rng(0)
  batch = TrainBatch(
      tokens_BxT=rng.integers(0, min(32000, model_cfg.vocab_size), (rows, t)).astype(np.int32),
      attn_mask_BxT=np.ones((rows, t), np.int32),
      loss_mask_BxT=(np.arange(t)[None] >= args.prompt_len).repeat(rows, 0).astype(np.float32),
      old_logps_BxT=np.full((rows, t), -8.0, np.float32),
      advantages_B=rng.normal(size=rows).astype(np.float32))
  t0 = time.time()
  compiled = learner.compile(rows, t)
  compile_s = time.time() - t0
  mem = compiled.memory_analysis()
  state = learner.init_state(jax.random.key(0))
  times = []
  for i in range(args.steps + 1):
    dev_batch = learner.put_batch(batch)
    jax.block_until_ready(dev_batch)
    t0 = time.perf_counter()
    state, metrics = compiled(state, dev_batch)
    jax.block_until_ready((state, metrics))
    if i > 0:  # Step 0 warms up (allocations, autotuning).
      times.append(time.perf_counter() - t0)
    check_finite(jax.device_get(metrics), i)
  step_s = statistics.median(times)
  profile = None
  if args.profile:  # One more step under the profiler: device time by kernel class (experiments/xla_profile.py).
    from experiments import xla_profile  # pylint: disable=g-import-not-at-top
    dev_batch = learner.put_batch(batch)
    table = xla_profile.profile_kernels(lambda: compiled(state, dev_batch),
                                        os.path.join(args.out, f"trace_{preset}"))
    print(xla_profile.format_table(table, 30), flush=True)
    profile = {k: table[k] for k in ("busy_ms", "by_class_ms", "top_kernels", "top_hlo_ops")}
  fwd, n_mm = flops_per_token(model_cfg, t)
  fwd_palm, _ = flops_per_token(model_cfg, t, full_attention=True)
  passes = 3 + (1 if learner.cfg.recompute_old_logps else 0)
  tokens = rows * t
  step_flops = tokens * fwd * passes
  n_dev = mesh.devices.size
  stats = {}
  try:
    stats = jax.devices()[0].memory_stats() or {}
  except Exception:  # pylint: disable=broad-except
    pass
  return {
      "preset": preset, "params": model_cfg.num_params(), "matmul_params": n_mm, "seq_len": t, "rows": rows,
      "micro_batch_per_device": mb, "accum": args.accum, "scan_layers": args.scan_layers, "devices": n_dev,
      "remat": args.remat,
      "attention": args.attention, "compile_s": round(compile_s, 1), "step_s": round(step_s, 4),
      "step_times_s": [round(x, 4) for x in times], "tokens_per_s": tokens / step_s,
      "tokens_per_s_per_device": tokens / step_s / n_dev,
      "tflops_per_s_per_device": step_flops / step_s / n_dev / 1e12,
      "mfu_datasheet": step_flops / step_s / n_dev / PEAK_DATASHEET,
      "mfu_measured_ceiling": step_flops / step_s / n_dev / PEAK_MEASURED,
      "mfu_palm": tokens * fwd_palm * passes / step_s / n_dev / PEAK_DATASHEET,
      "temp_gib": mem.temp_size_in_bytes / 2**30, "argument_gib": mem.argument_size_in_bytes / 2**30,
      "peak_gib_in_use": stats.get("peak_bytes_in_use", 0) / 2**30,
      "loss": float(metrics["loss"]), "grad_norm": float(metrics["grad_norm"]), "profile": profile,
  }


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", default=os.environ.get("OUT", "bench_learner_out"))
  p.add_argument("--presets", default="qwen2.5-0.5b,qwen2.5-1.5b")
  p.add_argument("--seq-len", type=int, default=4096)
  p.add_argument("--prompt-len", type=int, default=512, help="leading tokens without loss (the prompt)")
  p.add_argument("--micro-batch", default="qwen2.5-0.5b=8,qwen2.5-1.5b=4",
                 help="per-device micro-batch per preset, name=size,...")
  p.add_argument("--accum", type=int, default=2, help="micro-batches per minibatch (gradient accumulation)")
  p.add_argument("--steps", type=int, default=3, help="timed steps after the warm-up step")
  p.add_argument("--scan-layers", type=int, default=1, choices=(0, 1),
                 help="1: lax.scan over the decoder layers (rl.scan_layers); 0: unrolled")
  p.add_argument("--profile", action="store_true", help="trace one extra step; print device time by kernel")
  p.add_argument("--remat", default="none", choices=("none", "full", "dots"))
  p.add_argument("--attention", default="cudnn", choices=("cudnn", "xla"))
  p.add_argument("--logits-chunk", type=int, default=1024)
  p.add_argument("--mesh", default="fsdp=-1", help="mesh axes name=size,...; default all devices FSDP")
  p.add_argument("--lowered-digest", action="store_true",
                 help="print a digest of each preset's lowered step program and exit (no GPU needed)")
  args = p.parse_args()
  args.micro_batch = {k: int(v) for k, v in (kv.split("=") for kv in args.micro_batch.split(",") if kv)}
  os.makedirs(args.out, exist_ok=True)

  import jax  # pylint: disable=g-import-not-at-top
  from kevin_jax import sharding  # pylint: disable=g-import-not-at-top
  axes = tuple((n, int(s)) for n, s in (kv.split("=") for kv in args.mesh.split(",")))
  mesh = sharding.make_mesh(axes)
  device = f"{mesh.devices.size} x {jax.devices()[0].device_kind}"
  print(f"bench_learner on {device}, jax {jax.__version__}, mesh {dict(mesh.shape)}", flush=True)
  if args.lowered_digest:
    for preset in [x for x in args.presets.split(",") if x]:
      print(json.dumps(lowered_digest(preset, args, mesh)), flush=True)
    return 0
  results = []
  for preset in [x for x in args.presets.split(",") if x]:
    print(f"[{preset}] compiling and running ...", flush=True)
    try:
      r = bench_one(preset, args, mesh)
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()
      r = {"preset": preset, "error": f"{type(e).__name__}: {str(e)[:500]}"}
    results.append(r)
    print(json.dumps(r), flush=True)
  summary = {"device": device, "jax": jax.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
             "command": " ".join(sys.argv), "peak_datasheet": PEAK_DATASHEET, "peak_measured": PEAK_MEASURED,
             "flop_formula": __doc__.split("FLOP count")[1].strip(), "results": results}
  with open(os.path.join(args.out, "bench_learner.json"), "w") as f:
    json.dump(summary, f, indent=2)
  head = ("| preset | seq | rows x micro | compile s | step s | tokens/s | TFLOP/s/dev | MFU (989) | MFU (808) "
          "| MFU PaLM-attn | temp GiB | peak GiB |")
  lines = [head, "|" + "---|" * (head.count("|") - 1)]
  for r in results:
    if "error" in r:
      lines.append(f"| {r['preset']} | error: {r['error'][:80]} |")
      continue
    lines.append(f"| {r['preset']} | {r['seq_len']} | {r['rows']} x {r['micro_batch_per_device']} | {r['compile_s']} "
                 f"| {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | {r['tflops_per_s_per_device']:.0f} "
                 f"| {r['mfu_datasheet']:.1%} | {r['mfu_measured_ceiling']:.1%} | {r['mfu_palm']:.1%} "
                 f"| {r['temp_gib']:.1f} | {r['peak_gib_in_use']:.1f} |")
  md = (f"# Learner step benchmark\n\n{device}, jax {jax.__version__}, {summary['date']}\n\n"
        f"Command: `{summary['command']}`\n\nFLOP count:\n\n```\n{summary['flop_formula']}\n```\n\n"
        + "\n".join(lines) + "\n")
  with open(os.path.join(args.out, "bench_learner.md"), "w") as f:
    f.write(md)
  print("\n".join(lines))
  return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
  sys.exit(main())
