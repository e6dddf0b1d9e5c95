"""The worker processes of experiments/bench_sampler.py: our jitted sampler (JAX) and transformers' generate.

  python experiments/bench_sampler_workers.py jax --model 0.5b --batches 64 --json OUT.json [decode flags]
  python experiments/bench_sampler_workers.py hf --model 0.5b --batches 64 --weights-dir DIR --json OUT.json

bench_sampler.py starts one process per worker, so each framework gets clean peak-memory figures and reads its
XLA_FLAGS afresh. The JAX worker draws random bf16 weights for a model shape, compiles one sampler per batch size,
times one generate call per batch (1,024 prompt + 1,024 new tokens by default, temperature 0.9, EOS disabled),
measures the device's copy bandwidth (the roofline's denominator), and counts copies of the KV cache in the
optimized decode HLO. With --profile it then traces two more generate calls per batch and reports the device time
of one decode step by kernel. The decode flags (`add_decode_args`) choose the decode kernels; --kernel-opts binds
keyword arguments of the kernel functions for this process (`apply_kernel_opts`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import importlib
import json
import os
import sys
import tempfile
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = {"0.5b": "qwen2.5-0.5b", "1.5b": "qwen2.5-1.5b", "tiny": "tiny"}


# ----------------------------------------------------------------------------------------------------------
# decode options
# ----------------------------------------------------------------------------------------------------------
def add_decode_args(p: argparse.ArgumentParser, suppress: bool = False) -> None:
  """The JAX worker's decode options (bench_sampler.py takes them too, and per --variant). suppress: no defaults,
  so that a parse returns only the options given."""
  d = (lambda v: argparse.SUPPRESS) if suppress else (lambda v: v)
  p.add_argument("--attention", default=d("xla"), choices=("xla", "cudnn"), help="prefill attention implementation")
  for part, choices, what in (("attention", None, "attention over the visible cache slots"),
                              ("qkv", None, "q/k/v projection, RoPE and cache write in one kernel"),
                              ("out", None, "o projection + residual in one kernel"),
                              ("mlp", None, "the SwiGLU front in one kernel"),
                              ("down", None, "the down projection split along F"),
                              ("norm", ("auto", "xla", "fold", "inside"), "the norms in the q/k/v and SwiGLU kernels"),
                              ("stats", None, "the draw's chunk statistics in one pass")):
    p.add_argument(f"--decode-{part}", default=d("auto"), choices=choices or ("auto", "xla", "pallas"),
                   help=f"DecodeConfig.{part} ({what})")
  p.add_argument("--kernel-opts", default=d(""), help="keyword arguments of decode kernel functions, e.g. "
                 "'mlp.swiglu_front:num_stages=3' (modules of kevin_jax/policy/decode/)")
  p.add_argument("--xla-flags", default=d(""), help="more XLA_FLAGS for the JAX worker (after the caller's), e.g. "
                 "--xla-flags=--xla_gpu_enable_pdl=true")


DECODE_PARTS = ("attention", "qkv", "out", "mlp", "down", "norm", "stats")
DECODE_DESTS = ("attention",) + tuple("decode_" + part for part in DECODE_PARTS) + ("kernel_opts", "xla_flags")


def parse_kernel_opts(spec: str) -> list[tuple[str, str, dict]]:
  """'mlp.swiglu_front:num_stages=5;attention.decode_attention:balance=0' -> [(module, function, {keyword:
  value})]; integer values become ints. The modules are kevin_jax.policy.decode's (a 'decode_' prefix is dropped)."""
  out = []
  for part in filter(None, (p.strip() for p in spec.split(";"))):
    target, _, kws = part.partition(":")
    module, _, fn = target.partition(".")
    if not (module and fn and kws):
      raise ValueError(f"--kernel-opts: expected module.function:key=value,..., got {part!r}")
    opts = {}
    for kv in kws.split(","):
      key, eq, value = kv.partition("=")
      if not eq:
        raise ValueError(f"--kernel-opts: expected key=value, got {kv!r} in {part!r}")
      opts[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else value.strip()
    out.append((module.removeprefix("decode_"), fn, opts))
  return out


def apply_kernel_opts(spec: str) -> list[tuple[str, str, dict]]:
  """Rebinds each named function of kevin_jax.policy.decode.<module> to a functools.partial with the keywords, for
  this process. The decode step looks its kernels up on their modules when it is traced, so a step traced
  afterwards runs them with these options (block shapes, stages) without changing their defaults; keywords that
  the step passes from its DecodePlan (the attention's and down projection's splits) win over these."""
  opts = parse_kernel_opts(spec)
  for module, fn, kw in opts:
    mod = importlib.import_module(f"kevin_jax.policy.decode.{module}")
    setattr(mod, fn, functools.partial(getattr(mod, fn), **kw))
  return opts


# ----------------------------------------------------------------------------------------------------------
# JAX worker
# ----------------------------------------------------------------------------------------------------------
def _copy_bandwidth(jax, jnp) -> tuple[float, float]:
  """Device-to-device copy bandwidth, bytes/s (read + write of a 2 GiB buffer): (streamed, single).

  streamed (the roofline's): the best of 3 timings of 10 copies dispatched back to back, over 10, so the host's
  dispatch and sync are paid once per 10 copies; single: the best of 5 single copies each timed from the host,
  which spreads by about +-7 % between processes and reads lower, kept for comparison with figures computed so.
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


def decode_only(full_ms: dict, prefill_ms: dict, steps: int) -> dict:
  """Device ms per decode step by key: (the whole call's - a prefill-only call's) / decode steps."""
  if steps <= 0:
    raise ValueError(f"decode steps must be > 0, got {steps}")
  return {k: (full_ms.get(k, 0.0) - prefill_ms.get(k, 0.0)) / steps for k in sorted(set(full_ms) | set(prefill_ms))}


def _profile(sampler, model, prompts, kw: dict, seed: int, n_kernels: int = 15) -> dict:
  """Where one decode step's device time goes: a traced generate call with kw's new tokens minus a traced call
  with one new token (prefill and the first pick), over the decode steps; by kernel class and by kernel (the
  top n_kernels: us per step and launches per step). Runs after the timed call, so it does not change it."""
  from experiments import xla_profile  # pylint: disable=g-import-not-at-top
  kw1 = dict(kw, max_new_tokens=1)
  sampler.generate(model, prompts, seed=seed, eos_ids=[], **kw1)  # compiles the one-token call
  trace = tempfile.mkdtemp(prefix="bench_sampler_trace_")
  full = xla_profile.profile_kernels(lambda: sampler.generate(model, prompts, seed=seed, eos_ids=[], **kw).tokens,
                                     os.path.join(trace, "full"))
  steps = sampler.last_stats["decode_steps"]
  pre = xla_profile.profile_kernels(lambda: sampler.generate(model, prompts, seed=seed, eos_ids=[], **kw1).tokens,
                                    os.path.join(trace, "prefill"))
  ms = decode_only({n: t for n, t, _ in full["top_kernels"]}, {n: t for n, t, _ in pre["top_kernels"]}, steps)
  launches = decode_only({n: c for n, _, c in full["top_kernels"]}, {n: c for n, _, c in pre["top_kernels"]}, steps)
  top = sorted(ms, key=lambda n: -ms[n])[:n_kernels]
  return {"decode_steps": steps, "ms_per_step_by_class": decode_only(full["by_class_ms"], pre["by_class_ms"], steps),
          "top_kernels": [{"name": n, "us_per_step": 1e3 * ms[n], "launches_per_step": launches[n]} for n in top]}


def jax_worker(args) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy import get_preset  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy import sampler as sampler_lib  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy.decode.plan import DecodeConfig  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy.model import Qwen2  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy.sampler import Sampler, SamplerConfig  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy.weights import save_pretrained  # pylint: disable=g-import-not-at-top

  apply_kernel_opts(args.kernel_opts)  # before anything is traced
  dev = jax.local_devices()[0]
  out = {"device": str(dev.device_kind), "backend": jax.default_backend(), "jax": jax.__version__,
         "model": args.model, "runs": []}
  out["copy_bandwidth_Bps"], out["copy_bandwidth_single_Bps"] = _copy_bandwidth(jax, jnp)
  print(f"[jax] {out['device']}: copy bandwidth {out['copy_bandwidth_Bps'] / 1e9:,.0f} GB/s (10 copies streamed; "
        f"single copies: {out['copy_bandwidth_single_Bps'] / 1e9:,.0f} GB/s)", flush=True)
  cfg = get_preset(MODELS[args.model], param_dtype="bfloat16", compute_dtype="bfloat16",
                   attention_impl=args.attention)
  decode = DecodeConfig(**{part: getattr(args, "decode_" + part) for part in DECODE_PARTS})
  # What 'auto' became here, per batch: the figures depend on it.
  slots = args.prompt_len + -(-args.new_tokens // 64) * 64
  out["decode_plan"] = {b: dataclasses.asdict(sampler_lib.decode_plan(decode, cfg, b, slots, args.prompt_len))
                        for b in args.batches}
  print(f"[jax] decode plan by batch: {out['decode_plan']}", flush=True)
  t = time.perf_counter()
  # Random weights drawn on the host: jitting Qwen2's own initialiser compiles for minutes at these shapes, and
  # decode speed does not depend on the values.
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
                                                  kv_cache_dtype="bfloat16", decode=decode))
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
    if args.profile:
      run["profile"] = _profile(sampler, model, prompts, kw, args.seed + 1)
      print(f"[jax] B={b} profile, device ms per decode step by class: {run['profile']['ms_per_step_by_class']}",
            flush=True)
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


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("kind", choices=("jax", "hf"))
  p.add_argument("--model", required=True, choices=sorted(MODELS))
  p.add_argument("--batches", required=True, help="comma list")
  p.add_argument("--prompt-len", type=int, default=1024)
  p.add_argument("--new-tokens", type=int, default=1024)
  p.add_argument("--hf-new-tokens", type=int, default=64)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--weights-dir", default="", help="jax: also save the weights here; hf: load them from here")
  p.add_argument("--dump-dir", default="", help="jax: where XLA_FLAGS dumps the decode HLO")
  p.add_argument("--profile", action="store_true", help="jax: trace the decode step's kernels after the timing")
  p.add_argument("--json", required=True, help="where the worker writes its results")
  add_decode_args(p)
  args = p.parse_args(argv)
  args.batches = [int(b) for b in args.batches.split(",")]
  sys.path.insert(0, _REPO)
  res = jax_worker(args) if args.kind == "jax" else hf_worker(args)
  with open(args.json, "w") as fh:
    json.dump(res, fh, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
