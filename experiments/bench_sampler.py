"""Sampler throughput on one GPU: our jitted KV-cache sampler vs transformers' generate, and the decode roofline.

  XLA_PYTHON_CLIENT_PREALLOCATE=false python experiments/bench_sampler.py --out $OUT/bench_sampler

For each model shape (random weights, bf16: Qwen2.5-0.5B and -1.5B) and batch size (64, 256), with prompts of
1,024 random tokens and 1,024 new tokens (temperature 0.9, no top-k/top-p, EOS disabled so every row decodes
the full budget), it reports: compile time, prefill time, decode tokens/s, peak GPU memory; transformers'
PyTorch `generate` on the same GPU and the same weights (exported with our save_pretrained and loaded by
Qwen2ForCausalLM, sdpa attention) with --hf-new-tokens new tokens (default 64, to fit the time budget; its
tokens/s is per decode step and does not depend much on the count); and the decode roofline:
  bytes per decode step = weight bytes + KV-cache bytes of the tokens attended at that step
  roofline tokens/s    = batch * steps / (sum over steps of bytes / measured device copy bandwidth).
Each framework runs in its own subprocess (clean peak-memory numbers, no allocator contention). Writes
results.json, results.md and the workers' logs to --out, and prints the table last.

--smoke runs the same code on tiny shapes (CPU is fine) to check the script itself in a minute.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {"0.5b": "qwen2.5-0.5b", "1.5b": "qwen2.5-1.5b", "tiny": "tiny"}


# ----------------------------------------------------------------------------------------------------------
# JAX worker
# ----------------------------------------------------------------------------------------------------------
def _copy_bandwidth(jax, jnp) -> tuple[float, float]:
  """Device-to-device copy bandwidth, bytes/s (read + write of a 2 GiB buffer): (streamed, single).

  streamed (the roofline's): the best of 3 timings of 10 copies dispatched back to back, over 10, so the host's
  dispatch and sync are paid once per 10 copies; single: the best of 5 single copies each timed from the host
  (the method before 2026-12-05's thirtieth session, whose figures spread by +-7 % on an H200 and read ~3.45 TB/s
  there), kept so that older tables' "% of roofline" can be compared.
  """
  n = (2 << 30) // 4 if jax.default_backend() != "cpu" else (64 << 20) // 4
  x = jnp.ones((n,), jnp.float32)
  copy = jax.jit(lambda a: a + 1.0)
  copy(x).block_until_ready()
  single = float("inf")
  for _ in range(5):
    t = time.perf_counter()
    copy(x).block_until_ready()
    single = min(single, time.perf_counter() - t)
  streamed = float("inf")
  for _ in range(3):
    t = time.perf_counter()
    ys = [copy(x) for _ in range(10)]
    jax.block_until_ready(ys)
    streamed = min(streamed, (time.perf_counter() - t) / 10)
    del ys
  return 2 * n * 4 / streamed, 2 * n * 4 / single


def _cache_ops_in_decode(dump_dir: str, cache_shape_fragment: str) -> dict:
  """Counts copy/convert/transpose ops on cache-shaped arrays in the optimized _decode HLO (0 = in place)."""
  counts = {"copy": 0, "convert": 0, "transpose": 0, "files": 0}
  if not os.path.isdir(dump_dir):
    return counts
  for fn in os.listdir(dump_dir):
    if "_decode" in fn and fn.endswith("after_optimizations.txt"):
      counts["files"] += 1
      with open(os.path.join(dump_dir, fn)) as fh:
        for line in fh:
          if "=" not in line:
            continue
          lhs, rhs = line.split("=", 1)
          if cache_shape_fragment not in rhs.split("(")[0]:
            continue
          for op in ("copy", "convert", "transpose"):
            if f" {op}(" in rhs:
              counts[op] += 1
  return counts


def jax_worker(args) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy import get_preset  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy import model as model_lib  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy.model import Qwen2  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy.sampler import Sampler, SamplerConfig  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy.weights import save_pretrained  # pylint: disable=g-import-not-at-top
  from experiments.kernel_opts import apply_kernel_opts  # pylint: disable=g-import-not-at-top

  apply_kernel_opts(args.kernel_opts)  # before anything is traced
  dev = jax.local_devices()[0]
  out = {"device": str(dev.device_kind), "backend": jax.default_backend(), "jax": jax.__version__,
         "model": args.model, "runs": []}
  out["copy_bandwidth_Bps"], out["copy_bandwidth_single_Bps"] = _copy_bandwidth(jax, jnp)
  print(f"[jax] {out['device']}: copy bandwidth {out['copy_bandwidth_Bps'] / 1e9:,.0f} GB/s (10 copies streamed; "
        f"single copies: {out['copy_bandwidth_single_Bps'] / 1e9:,.0f} GB/s)", flush=True)
  cfg = get_preset(MODELS[args.model], param_dtype="bfloat16", compute_dtype="bfloat16",
                   attention_impl=args.attention, decode_attention=args.decode_attention,
                   decode_qkv=args.decode_qkv, decode_out=args.decode_out, decode_add_norm=args.decode_add_norm,
                   decode_norm=args.decode_norm)
  # What 'auto' became here (decode_out per batch): the figures depend on it.
  out["decode_norm_resolved"] = model_lib.decode_norm_impl(cfg)
  resolve_out = model_lib._decode_out_impl  # pylint: disable=protected-access
  out["decode_out_resolved"] = {b: resolve_out(cfg, b) for b in args.batches}
  print(f"[jax] decode_norm {args.decode_norm} -> {out['decode_norm_resolved']}, decode_out {args.decode_out} -> "
        f"{out['decode_out_resolved']} (by batch)", flush=True)
  t = time.perf_counter()
  # Random weights drawn on the host: jitting Qwen2's own initialiser compiled for minutes on the H200
  # (XLA "very slow compile" alarm, 2026-11-29), and decode speed does not depend on the values.
  graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Qwen2(cfg, rngs=nnx.Rngs(0))))
  host_rng = np.random.default_rng(args.seed)
  state = jax.tree.map(lambda a: jax.device_put(
      (host_rng.standard_normal(a.shape, dtype=np.float32) * 0.02).astype(a.dtype)), abstract)
  model = nnx.merge(graphdef, state)
  jax.block_until_ready(nnx.state(model))
  out["init_s"] = time.perf_counter() - t
  print(f"[jax] random init of {cfg.num_params() / 1e6:.0f}M params in {out['init_s']:.1f}s", flush=True)
  out["num_params"] = cfg.num_params()
  if args.weights_dir:
    t = time.perf_counter()
    save_pretrained(model, args.weights_dir)
    out["save_s"] = time.perf_counter() - t
    print(f"[jax] saved weights for transformers in {out['save_s']:.1f}s", flush=True)
  rng = np.random.RandomState(args.seed)
  kw = dict(max_new_tokens=args.new_tokens, temperature=0.9, top_p=1.0, top_k=0)
  samplers = {b: Sampler(cfg, None, SamplerConfig(batch_size=b, prompt_buckets=(args.prompt_len,),
                                                  kv_cache_dtype="bfloat16", decode_fusion=bool(args.decode_fusion),
                                                  decode_head=args.decode_head))
              for b in args.batches}
  # Compile every batch size's prefill + decode concurrently (XLA compiles outside the GIL): saves wall time.
  t = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(len(samplers)) as pool:
    futures = {b: pool.submit(s.warmup, model, args.prompt_len, **kw) for b, s in samplers.items()}
    compile_times = {b: f.result() for b, f in futures.items()}
  out["compile_wall_s"] = time.perf_counter() - t
  print(f"[jax] compiled {len(samplers)} batch sizes in {out['compile_wall_s']:.1f}s (concurrently)", flush=True)
  for b in args.batches:
    sampler = samplers[b]
    compile_s = compile_times[b]
    prompts = rng.randint(0, 150000 if cfg.vocab_size > 150000 else cfg.vocab_size,
                          (b, args.prompt_len)).tolist()
    t = time.perf_counter()
    res = sampler.generate(model, prompts, seed=args.seed, eos_ids=[], **kw)
    total = time.perf_counter() - t
    st = sampler.last_stats
    lengths = [len(x) for x in res.tokens]
    logps = np.concatenate(res.logprobs)
    run = {
        "batch": b, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "compile_s": compile_s,
        "prefill_s": st["prefill_s"], "decode_s": st["decode_s"], "decode_steps": st["decode_steps"],
        "total_s": total, "decode_tok_s": b * st["decode_steps"] / st["decode_s"],
        "peak_bytes": (dev.memory_stats() or {}).get("peak_bytes_in_use"),
        "all_full_length": all(n == args.new_tokens for n in lengths),
        "logprobs_finite_nonpositive": bool(np.all(np.isfinite(logps)) and np.all(logps <= 1e-6)),
        "mean_logprob": float(logps.mean()),
    }
    out["runs"].append(run)
    print(f"[jax] B={b}: compile {compile_s:.1f}s prefill {run['prefill_s']:.3f}s decode "
          f"{run['decode_tok_s']:.0f} tok/s peak {run['peak_bytes'] or 0:.3g} B", flush=True)
  cache_dims = f"[{args.batches[0]},{cfg.num_kv_heads},{args.prompt_len + args.new_tokens},{cfg.head_dim}]"
  out["cache_ops_in_decode_hlo"] = _cache_ops_in_decode(args.dump_dir, cache_dims)
  return out


# ----------------------------------------------------------------------------------------------------------
# transformers worker
# ----------------------------------------------------------------------------------------------------------
def hf_worker(args) -> dict:
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from transformers import Qwen2ForCausalLM  # pylint: disable=g-import-not-at-top
  cuda = torch.cuda.is_available()
  device = "cuda" if cuda else "cpu"
  out = {"torch": torch.__version__, "transformers": transformers.__version__, "device": device, "runs": []}
  t = time.perf_counter()
  model = Qwen2ForCausalLM.from_pretrained(args.weights_dir, dtype=torch.bfloat16, attn_implementation="sdpa")
  model = model.to(device).eval()
  out["load_s"] = time.perf_counter() - t
  gen = torch.Generator(device="cpu").manual_seed(args.seed)
  vocab = model.config.vocab_size
  sync = torch.cuda.synchronize if cuda else (lambda: None)
  for b in args.batches:
    ids = torch.randint(0, min(vocab, 150000), (b, args.prompt_len), generator=gen).to(device)
    mask = torch.ones_like(ids)
    kw = dict(do_sample=True, temperature=0.9, top_k=0, top_p=1.0, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
      model.generate(ids, attention_mask=mask, max_new_tokens=2, min_new_tokens=2, **kw)  # warm up kernels
      if cuda:
        torch.cuda.reset_peak_memory_stats()
      sync()
      t = time.perf_counter()
      model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
      sync()
      prefill_s = time.perf_counter() - t
      t = time.perf_counter()
      seq = model.generate(ids, attention_mask=mask, max_new_tokens=args.hf_new_tokens,
                           min_new_tokens=args.hf_new_tokens, **kw)
      sync()
      total = time.perf_counter() - t
    steps = seq.shape[1] - args.prompt_len - 1  # the first new token comes from the prefill
    run = {"batch": b, "prompt_len": args.prompt_len, "new_tokens": args.hf_new_tokens, "prefill_s": prefill_s,
           "total_s": total, "decode_tok_s": b * steps / max(total - prefill_s, 1e-9),
           "peak_bytes": torch.cuda.max_memory_allocated() if cuda else None}
    out["runs"].append(run)
    print(f"[hf] B={b}: prefill {prefill_s:.3f}s decode {run['decode_tok_s']:.0f} tok/s", flush=True)
    del seq
    if cuda:
      torch.cuda.empty_cache()
  return out


# ----------------------------------------------------------------------------------------------------------
# orchestration
# ----------------------------------------------------------------------------------------------------------
def roofline_tok_s(cfg, batch: int, prompt_len: int, new_tokens: int, bandwidth: float) -> float:
  """Decode tokens/s if every step only read the weights once and the KV cache of the attended tokens."""
  weight_bytes = 2 * (cfg.num_params() - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size))
  kv_per_token = cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 2  # k and v, bf16
  steps = range(1, new_tokens)  # decode step t attends to prompt_len + t tokens
  total_bytes = sum(weight_bytes + batch * kv_per_token * (prompt_len + t) for t in steps)
  return batch * len(steps) / (total_bytes / bandwidth)


def _run_worker(kind: str, args, model: str, weights_dir: str, out_dir: str, timeout: float) -> dict:
  dump = os.path.join(tempfile.gettempdir(), f"bench_hlo_{model}_{os.getpid()}")
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--model", model,
         "--weights-dir", weights_dir, "--batches", ",".join(map(str, args.batches)),
         "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens),
         "--hf-new-tokens", str(args.hf_new_tokens), "--seed", str(args.seed), "--attention", args.attention,
         "--decode-attention", args.decode_attention, "--decode-qkv", args.decode_qkv, "--decode-out",
         args.decode_out, "--decode-add-norm", args.decode_add_norm, "--decode-norm", args.decode_norm,
         "--decode-fusion", str(args.decode_fusion),
         "--decode-head", args.decode_head, "--kernel-opts", args.kernel_opts,
         "--dump-dir", dump, "--json", os.path.join(out_dir, f"{kind}_{model}.json")]
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", PYTHONPATH=_REPO + os.pathsep +
             os.environ.get("PYTHONPATH", ""))
  if kind == "jax":
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" {args.xla_flags} --xla_dump_to={dump} --xla_dump_hlo_as_text"
                        " --xla_dump_hlo_module_re=.*_decode.*").strip()
  log = os.path.join(out_dir, f"{kind}_{model}.log")
  t = time.perf_counter()
  with open(log, "w") as fh:
    try:
      proc = subprocess.run(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, check=False)
      rc = proc.returncode
    except subprocess.TimeoutExpired:
      rc = "timeout"
  shutil.rmtree(dump, ignore_errors=True)
  wall = time.perf_counter() - t
  path = os.path.join(out_dir, f"{kind}_{model}.json")
  if rc != 0 or not os.path.isfile(path):
    with open(log) as fh:
      tail = fh.read()[-1500:]
    print(f"[bench] {kind} worker for {model} failed (rc={rc}, {wall:.0f}s); log tail:\n{tail}", flush=True)
    return {"error": f"rc={rc}", "wall_s": wall}
  with open(path) as fh:
    res = json.load(fh)
  res["wall_s"] = wall
  return res


def _gb(x):
  return "-" if x is None else f"{x / 1e9:.1f}"


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", default=os.environ.get("OUT") and os.path.join(os.environ["OUT"], "bench_sampler")
                 or os.path.join(_REPO, "runs", "bench_sampler"))
  p.add_argument("--models", default="0.5b,1.5b", help=f"comma list of {sorted(MODELS)}")
  p.add_argument("--batches", default="64,256")
  p.add_argument("--prompt-len", type=int, default=1024)
  p.add_argument("--new-tokens", type=int, default=1024)
  p.add_argument("--hf-new-tokens", type=int, default=64)
  p.add_argument("--no-hf", action="store_true", help="skip transformers")
  p.add_argument("--attention", default="xla", choices=("xla", "cudnn"), help="prefill attention implementation")
  p.add_argument("--decode-attention", default="auto", choices=("auto", "xla", "pallas"),
                 help="decode attention (auto: the Pallas kernel on a GPU)")
  p.add_argument("--decode-qkv", default="auto", choices=("auto", "xla", "pallas"),
                 help="ModelConfig.decode_qkv (pallas: q/k/v projection, RoPE and cache write in one kernel)")
  p.add_argument("--decode-out", default="auto", choices=("auto", "xla", "pallas"),
                 help="ModelConfig.decode_out (pallas: o projection + residual in one kernel; auto: where the "
                 "q/k/v kernel applies the norm inside)")
  p.add_argument("--decode-add-norm", default="xla", choices=("auto", "xla", "pallas"),
                 help="ModelConfig.decode_add_norm (pallas: the residual add after the MLP + the next norm)")
  p.add_argument("--decode-norm", default="auto", choices=("auto", "xla", "fold", "inside"),
                 help="ModelConfig.decode_norm (fold, inside: the norms applied in the q/k/v and SwiGLU kernels; "
                 "auto: inside on a GPU up to hidden size 1,024)")
  p.add_argument("--decode-fusion", type=int, default=0, choices=(0, 1),
                 help="SamplerConfig.decode_fusion (1: the decode loop compiled with multi-output fusions)")
  p.add_argument("--decode-head", default="xla", choices=("auto", "xla", "pallas"),
                 help="SamplerConfig.decode_head (pallas: the LM head and the draw in one kernel)")
  p.add_argument("--kernel-opts", default="", help="decode kernels' keyword arguments in the JAX worker, e.g. "
                 "'decode_attention.decode_attention:merge=unrolled' (experiments/kernel_opts.py)")
  p.add_argument("--xla-flags", default="", help="more XLA_FLAGS for the JAX worker (after the caller's), e.g. "
                 "--xla-flags=--xla_gpu_enable_pdl=true")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--budget-s", type=float, default=225.0, help="skip remaining workers past this wall time")
  p.add_argument("--smoke", action="store_true", help="tiny shapes (checks the script; CPU ok)")
  p.add_argument("--worker", choices=("jax", "hf"), help=argparse.SUPPRESS)
  p.add_argument("--model", help=argparse.SUPPRESS)
  p.add_argument("--weights-dir", default="", help=argparse.SUPPRESS)
  p.add_argument("--dump-dir", default="", help=argparse.SUPPRESS)
  p.add_argument("--json", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.smoke:
    args.models, args.prompt_len, args.new_tokens, args.hf_new_tokens = "tiny", 32, 16, 8
    args.batches = "2,4"
  args.batches = [int(b) for b in str(args.batches).split(",")] if isinstance(args.batches, str) else args.batches

  if args.worker:
    res = jax_worker(args) if args.worker == "jax" else hf_worker(args)
    with open(args.json, "w") as fh:
      json.dump(res, fh, indent=2)
    return 0

  os.makedirs(args.out, exist_ok=True)
  t0 = time.perf_counter()
  results = {"args": {k: v for k, v in vars(args).items() if k not in ("worker", "model", "json")},
             "date": time.strftime("%Y-%m-%d %H:%M:%S"), "models": {}}
  for model in args.models.split(","):
    if model not in MODELS:
      raise SystemExit(f"unknown model {model!r}; known: {sorted(MODELS)}")
  for model in args.models.split(","):
    wdir = tempfile.mkdtemp(prefix=f"bench_weights_{model}_")  # outside --out: GBs of safetensors
    entry = results["models"][model] = {}
    try:
      left = args.budget_s - (time.perf_counter() - t0)
      if left < 30:
        entry["jax"] = {"error": f"skipped: time budget ({args.budget_s:.0f}s) spent"}
      else:
        entry["jax"] = _run_worker("jax", args, model, "" if args.no_hf else wdir, args.out, left)
      results["wall_s"] = time.perf_counter() - t0
      write_summary(results, args, final=False)  # partial results survive an external time limit
      left = args.budget_s - (time.perf_counter() - t0)
      if args.no_hf or "error" in entry["jax"]:
        entry["hf"] = {"skipped": "--no-hf" if args.no_hf else "jax worker failed"}
      elif left < 20:
        entry["hf"] = {"skipped": f"time budget ({args.budget_s:.0f}s) spent"}
      else:
        entry["hf"] = _run_worker("hf", args, model, wdir, args.out, left)
    finally:
      shutil.rmtree(wdir, ignore_errors=True)
    results["wall_s"] = time.perf_counter() - t0
    write_summary(results, args, final=False)
  write_summary(results, args, final=True)
  return 0


def write_summary(results: dict, args, final: bool) -> None:
  """Adds roofline numbers, writes results.json + results.md; prints the notes and table when final."""
  sys.path.insert(0, _REPO)
  from kevin_jax.policy import get_preset  # pylint: disable=g-import-not-at-top
  header = ("| model | batch | ours decode tok/s | % of roofline | roofline tok/s | prefill s | compile s | "
            "peak GB | HF decode tok/s | HF prefill s | HF peak GB | speedup vs HF |")
  lines = [header, "|" + "---|" * 12]
  for model, entry in results["models"].items():
    cfg = get_preset(MODELS[model])
    jx, hf = entry.get("jax", {}), entry.get("hf", {})
    hf_runs = {r["batch"]: r for r in hf.get("runs", [])}
    for r in jx.get("runs", []):
      roof = roofline_tok_s(cfg, r["batch"], r["prompt_len"], r["new_tokens"], jx["copy_bandwidth_Bps"])
      r["roofline_tok_s"], r["roofline_frac"] = roof, r["decode_tok_s"] / roof
      h = hf_runs.get(r["batch"])
      ours = (f"| {MODELS[model]} | {r['batch']} | {r['decode_tok_s']:,.0f} | {100 * r['roofline_frac']:.0f}% | "
              f"{roof:,.0f} | {r['prefill_s']:.2f} | {r['compile_s']:.1f} | {_gb(r['peak_bytes'])} |")
      theirs = (f" {h['decode_tok_s']:,.0f} | {h['prefill_s']:.2f} | {_gb(h['peak_bytes'])} | "
                f"{r['decode_tok_s'] / h['decode_tok_s']:.1f}x |" if h else " - | - | - | - |")
      lines.append(ours + theirs)
    for side in ("jax", "hf"):
      e = entry.get(side, {})
      if "error" in e or "skipped" in e:
        lines.append(f"| {MODELS[model]} | - | {side}: {e.get('error') or e.get('skipped')} "
                     f"(see {side}_{model}.log) |" + " |" * 9)
  any_jax = next((e["jax"] for e in results["models"].values() if "copy_bandwidth_Bps" in e.get("jax", {})), {})
  notes = [
      f"Device: {any_jax.get('device', '?')}; measured copy bandwidth "
      f"{any_jax.get('copy_bandwidth_Bps', 0) / 1e9:,.0f} GB/s (10 copies streamed; the roofline's), single "
      f"copies timed alone {any_jax.get('copy_bandwidth_single_Bps', 0) / 1e9:,.0f} GB/s (the method of the tables "
      f"before 2026-12-05); jax {any_jax.get('jax', '?')}.",
      f"Prompt {args.prompt_len} random tokens, ours {args.new_tokens} new tokens, transformers "
      f"{args.hf_new_tokens} new tokens (sdpa, bf16, same weights); temperature 0.9, EOS disabled.",
      "Roofline: (weights + KV of attended tokens) bytes per step / copy bandwidth. 'compile s' per batch "
      f"size, compiled concurrently. Whole run {results.get('wall_s', 0):.0f}s"
      + ("." if final else " (partial)."),
      f"Decode kernels: decode_attention={args.decode_attention}, decode_qkv={args.decode_qkv}, decode_out="
      f"{args.decode_out}, decode_add_norm={args.decode_add_norm}, decode_norm={args.decode_norm}, "
      f"decode_fusion={args.decode_fusion}, decode_head={args.decode_head}; kernel "
      f"options: {args.kernel_opts or 'defaults'}; more XLA_FLAGS: {args.xla_flags or 'none'}.",
  ]
  for model, entry in results["models"].items():
    ops = entry.get("jax", {}).get("cache_ops_in_decode_hlo")
    if ops:
      notes.append(f"{model}: copy/convert/transpose ops on KV-cache-shaped arrays in the optimized decode HLO "
                   f"(batch {args.batches[0]}): {ops['copy']}/{ops['convert']}/{ops['transpose']} "
                   f"(0/0/0 = cache read and updated in place; {ops['files']} HLO files).")
  table = "\n".join(lines)
  with open(os.path.join(args.out, "results.json"), "w") as fh:
    json.dump(results, fh, indent=2)
  with open(os.path.join(args.out, "results.md"), "w") as fh:
    fh.write("# Sampler benchmark\n\n" + table + "\n\n" + "\n".join(f"- {n}" for n in notes) + "\n")
  if final:
    print("\n".join(notes))
    print(table)


if __name__ == "__main__":
  sys.exit(main())
