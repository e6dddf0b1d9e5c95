"""Where a decode step's time goes: attention kernels side by side, and a traced generate call per impl.

  XLA_PYTHON_CLIENT_PREALLOCATE=false python experiments/profile_decode.py --out $OUT/profile_decode

1. Decode attention alone, one layer's cache of a Qwen2.5-0.5B shape (K=2, G=7, H=64, bf16), prompt P slots all
   visible plus `--gen-visible` generated slots, in a jitted fori_loop of 200 calls: the masked XLA einsum
   (reads all S slots) vs the Pallas kernel (policy/decode_attention.py: reads only visible blocks). Reports
   microseconds per call and the effective bandwidth over the visible K/V bytes.
2. A generate call (random weights, --new-tokens) traced per decode_attention impl: device time by kernel
   class and the top kernels (experiments/xla_profile.py), and decode tokens/s of that call. A second traced
   call of the same prompts with one new token (prefill and the first pick only) is subtracted to give device
   time per decode step by class (`decode_ms_per_step_by_class`); `per_step_ms_by_class` (the whole call over
   steps + 1, as reported before 2026-12-02) spreads the prefill's GEMMs over the decode steps.
Writes results.json and the printed tables to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position
from flax import nnx  # pylint: disable=wrong-import-position

from experiments import xla_profile  # pylint: disable=wrong-import-position
from experiments.kernel_opts import apply_kernel_opts  # pylint: disable=wrong-import-position
from kevin_jax.policy import decode_attention as decode_attention_module  # pylint: disable=wrong-import-position
from kevin_jax.policy import get_preset  # pylint: disable=wrong-import-position
from kevin_jax.policy.decode_attention import SlotRanges  # pylint: disable=wrong-import-position
from kevin_jax.policy.model import Qwen2, _decode_attend  # pylint: disable=wrong-import-position
from kevin_jax.policy.sampler import Sampler, SamplerConfig  # pylint: disable=wrong-import-position

MODELS = {"0.5b": "qwen2.5-0.5b", "1.5b": "qwen2.5-1.5b", "tiny": "tiny", "small": "small"}


def attention_bench(b: int, p: int, new: int, gen_visible: int, reps: int, cfg) -> dict:
  k_heads, g, h = cfg.num_kv_heads, cfg.num_heads // cfg.num_kv_heads, cfg.head_dim
  s = p + new
  key = jax.random.PRNGKey(0)
  q = jax.random.normal(key, (b, k_heads, g, h), jnp.bfloat16)
  kc = jax.random.normal(jax.random.fold_in(key, 1), (b, k_heads, s, h), jnp.bfloat16)
  vc = jax.random.normal(jax.random.fold_in(key, 2), (b, k_heads, s, h), jnp.bfloat16)
  ranges = SlotRanges(prompt_len_B=jnp.full((b,), p, jnp.int32), gen_len=jnp.int32(gen_visible), gen_start=p)
  fns = {"xla": lambda q_: _decode_attend(q_, kc, vc, ranges.mask(s), True),
         "pallas": lambda q_: decode_attention_module.decode_attention(q_, kc, vc, ranges)}  # --kernel-opts apply
  out = {"batch": b, "slots": s, "visible": p + gen_visible}
  visible_bytes = 2 * b * k_heads * (p + gen_visible) * h * 2
  ref = None
  for name, f in fns.items():
    loop = jax.jit(lambda q0, f=f: jax.lax.fori_loop(0, reps, lambda i, x: f(x).astype(x.dtype), q0))
    try:
      o1 = jax.jit(f)(q)
      loop(q).block_until_ready()
      t = time.perf_counter()
      loop(q).block_until_ready()
      us = (time.perf_counter() - t) / reps * 1e6
    except Exception as e:  # pylint: disable=broad-except
      out[name] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
      print(f"[attn] B={b} {name}: FAILED {out[name]['error']}", flush=True)
      continue
    if ref is None:
      ref = np.asarray(o1, np.float32)
    err = float(np.max(np.abs(np.asarray(o1, np.float32) - ref)))
    out[name] = {"us": us, "visible_GBps": visible_bytes / us / 1e3, "max_abs_diff_vs_xla": err}
    print(f"[attn] B={b} S={s} visible={p + gen_visible} {name}: {us:8.1f} us/call, "
          f"{visible_bytes / us / 1e3:7.0f} GB/s over visible K/V, |diff| {err:.2e}", flush=True)
  return out


def decode_only(full_ms: dict, prefill_ms: dict, steps: int) -> dict:
  """Device ms per decode step by key: (the whole call's - a prefill-only call's) / decode steps."""
  if steps <= 0:
    raise ValueError(f"decode steps must be > 0, got {steps}")
  return {k: (full_ms.get(k, 0.0) - prefill_ms.get(k, 0.0)) / steps for k in sorted(set(full_ms) | set(prefill_ms))}


def traced_generate(cfg_name: str, impl: str, b: int, p: int, new: int, out_dir: str, state_np,
                    reduce_chunks: int = 32, decode_mlp: str = "auto", decode_down: str = "auto",
                    decode_fusion: bool = False, decode_qkv: str = "auto", decode_out: str = "xla",
                    decode_add_norm: str = "xla", decode_head: str = "xla", decode_norm: str = "xla") -> dict:
  prefill_attention = "cudnn" if jax.default_backend() == "gpu" else "xla"
  cfg = get_preset(cfg_name, param_dtype="bfloat16", compute_dtype="bfloat16", attention_impl=prefill_attention,
                   decode_attention=impl, decode_mlp=decode_mlp, decode_down=decode_down, decode_qkv=decode_qkv,
                   decode_out=decode_out, decode_add_norm=decode_add_norm, decode_norm=decode_norm)
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: Qwen2(cfg, rngs=nnx.Rngs(0))))
  model = nnx.merge(graphdef, jax.tree.map(jax.device_put, state_np))
  sampler = Sampler(cfg, None, SamplerConfig(batch_size=b, prompt_buckets=(p,), kv_cache_dtype="bfloat16",
                                             reduce_chunks=reduce_chunks, decode_fusion=decode_fusion,
                                             decode_head=decode_head))
  kw = dict(max_new_tokens=new, temperature=0.9, top_p=1.0, top_k=0, eos_ids=[])
  prompts = np.random.RandomState(0).randint(0, min(cfg.vocab_size, 150000), (b, p)).tolist()
  kw1 = dict(kw, max_new_tokens=1)  # Prefill and the first pick: what the full call spends besides decoding.
  sampler.generate(model, prompts, seed=0, **kw1)  # compile
  sampler.generate(model, prompts, seed=0, **kw)  # compile
  sampler.generate(model, prompts, seed=1, **kw)
  st = sampler.last_stats
  tok_s = b * st["decode_steps"] / st["decode_s"]
  table = xla_profile.profile_kernels(lambda: sampler.generate(model, prompts, seed=2, **kw).tokens,
                                      os.path.join(out_dir, f"trace_{impl}_b{b}_r{reduce_chunks}"))
  steps = st["decode_steps"]  # Every call runs new - 1 decode steps (no EOS ids).
  prefill = xla_profile.profile_kernels(lambda: sampler.generate(model, prompts, seed=2, **kw1).tokens,
                                        os.path.join(out_dir, f"trace_{impl}_b{b}_r{reduce_chunks}_prefill"))
  decode = decode_only(table["by_class_ms"], prefill["by_class_ms"], steps)
  print(f"[gen] {impl} B={b} reduce_chunks={reduce_chunks}: decode {tok_s:,.0f} tok/s "
        f"({st['decode_s'] / steps * 1e3:.3f} ms/step)", flush=True)
  print(xla_profile.format_table(table, 15), flush=True)
  print(f"prefill-only call: device busy {prefill['busy_ms']:.2f} ms; decode device ms/step by class: " +
        ", ".join(f"{k} {v:.3f}" for k, v in sorted(decode.items(), key=lambda kv: -kv[1])), flush=True)
  return {"impl": impl, "batch": b, "reduce_chunks": reduce_chunks, "decode_tok_s": tok_s,
          "ms_per_step": st["decode_s"] / steps * 1e3,
          "per_step_ms_by_class": {k: v / (steps + 1) for k, v in table["by_class_ms"].items()},
          "decode_ms_per_step_by_class": decode, "prefill_ms_by_class": prefill["by_class_ms"],
          "top_kernels": table["top_kernels"][:25], "top_hlo_ops": table["top_hlo_ops"][:25]}


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", default=os.environ.get("OUT", "runs/profile_decode"))
  ap.add_argument("--model", default="0.5b", choices=sorted(MODELS))
  ap.add_argument("--batches", default="64,256")
  ap.add_argument("--prompt-len", type=int, default=1024)
  ap.add_argument("--attn-new", type=int, default=1024, help="generated slots in the attention bench's cache")
  ap.add_argument("--gen-visible", type=int, default=512, help="generated slots visible in the attention bench")
  ap.add_argument("--new-tokens", type=int, default=256, help="tokens per row in the traced generate calls")
  ap.add_argument("--impls", default="xla,pallas")
  ap.add_argument("--reps", type=int, default=200)
  ap.add_argument("--reduce-chunks", default="32", help="SamplerConfig.reduce_chunks values to trace, in turn "
                  "(e.g. 32,1: the sampling step's two-stage row reductions vs XLA's one-stage ones)")
  ap.add_argument("--decode-mlp", default="auto", choices=("auto", "xla", "pallas"),
                  help="ModelConfig.decode_mlp of the traced generate calls (one per process: JAX reuses a trace)")
  ap.add_argument("--decode-down", default="auto", choices=("auto", "xla", "pallas"),
                  help="ModelConfig.decode_down (the decode step's down projection; pallas: the split kernel)")
  ap.add_argument("--decode-qkv", default="auto", choices=("auto", "xla", "pallas", "interpret"),
                  help="ModelConfig.decode_qkv (pallas: q/k/v projection, RoPE and cache write in one kernel)")
  ap.add_argument("--decode-out", default="auto", choices=("auto", "xla", "pallas", "interpret"),
                  help="ModelConfig.decode_out (pallas: o projection + residual in one kernel; auto: where the "
                  "q/k/v kernel applies the norm inside)")
  ap.add_argument("--decode-add-norm", default="xla", choices=("auto", "xla", "pallas", "interpret"),
                  help="ModelConfig.decode_add_norm (pallas: the residual add after the MLP + the next norm)")
  ap.add_argument("--decode-norm", default="auto", choices=("auto", "xla", "fold", "inside"),
                  help="ModelConfig.decode_norm (fold, inside: the norms applied in the q/k/v and SwiGLU kernels; "
                  "auto: inside on a GPU up to hidden size 1,024)")
  ap.add_argument("--decode-fusion", default=0, type=int, choices=(0, 1),
                  help="SamplerConfig.decode_fusion (1: the decode loop compiled with multi-output fusions)")
  ap.add_argument("--decode-head", default="xla", choices=("auto", "xla", "pallas", "interpret"),
                  help="SamplerConfig.decode_head (pallas: the LM head and the draw in one kernel)")
  ap.add_argument("--no-attention", action="store_true", help="skip the decode-attention microbenchmark")
  ap.add_argument("--kernel-opts", default="", help="keyword arguments for decode kernels in this process, e.g. "
                  "'decode_mlp.swiglu_front:num_stages=5;decode_attention.decode_attention:num_splits=1' "
                  "(module.function of kevin_jax.policy: key=value,...; see apply_kernel_opts)")
  a = ap.parse_args()
  kernel_opts = apply_kernel_opts(a.kernel_opts)  # before anything is traced
  os.makedirs(a.out, exist_ok=True)
  batches = [int(x) for x in a.batches.split(",")]
  cfg = get_preset(MODELS[a.model])
  res = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "model": a.model,
         "decode_mlp": a.decode_mlp, "decode_down": a.decode_down, "decode_fusion": bool(a.decode_fusion),
         "decode_qkv": a.decode_qkv, "decode_out": a.decode_out, "decode_add_norm": a.decode_add_norm,
         "decode_head": a.decode_head, "decode_norm": a.decode_norm, "kernel_opts": a.kernel_opts, "attention": [],
         "generate": []}
  for b in batches if not a.no_attention else ():
    res["attention"].append(attention_bench(b, a.prompt_len, a.attn_new, a.gen_visible, a.reps, cfg))
  rng = np.random.default_rng(0)
  _, abstract = nnx.split(nnx.eval_shape(lambda: Qwen2(cfg, rngs=nnx.Rngs(0))))
  state_np = jax.tree.map(lambda x: (rng.standard_normal(x.shape, dtype=np.float32) * 0.02).astype(x.dtype),
                          abstract)
  for b in batches:
    for impl in a.impls.split(","):
      for chunks in (int(x) for x in a.reduce_chunks.split(",")):
        try:
          res["generate"].append(traced_generate(MODELS[a.model], impl, b, a.prompt_len, a.new_tokens, a.out,
                                                 state_np, chunks, a.decode_mlp, a.decode_down,
                                                 bool(a.decode_fusion), a.decode_qkv, a.decode_out,
                                                 a.decode_add_norm, a.decode_head, a.decode_norm))
        except Exception as e:  # pylint: disable=broad-except
          print(f"[gen] {impl} B={b} reduce_chunks={chunks}: FAILED {type(e).__name__}: {str(e)[:800]}", flush=True)
          res["generate"].append({"impl": impl, "batch": b, "reduce_chunks": chunks,
                                  "error": f"{type(e).__name__}: {str(e)[:800]}"})
  with open(os.path.join(a.out, "results.json"), "w") as f:
    json.dump(res, f, indent=1)
  print(f"\nsummary (XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, decode_mlp={a.decode_mlp}, "
        f"decode_down={a.decode_down}, decode_fusion={a.decode_fusion}, decode_qkv={a.decode_qkv}, "
        f"decode_out={a.decode_out}, decode_add_norm={a.decode_add_norm}, decode_head={a.decode_head}, "
        f"decode_norm={a.decode_norm}, kernel options {kernel_opts}):")
  for r in res["attention"]:
    print(f"  attention B={r['batch']}: " + ", ".join(
        f"{k} {v['us']:.1f} us ({v['visible_GBps']:.0f} GB/s, diff {v['max_abs_diff_vs_xla']:.1e})" if "us" in v
        else f"{k} FAILED" for k, v in r.items() if isinstance(v, dict)))
  for g in res["generate"]:
    if "error" in g:
      print(f"  generate {g['impl']} B={g['batch']} reduce_chunks={g['reduce_chunks']}: FAILED {g['error'][:200]}")
    else:
      cls = ", ".join(f"{k} {v:.3f}" for k, v in sorted(g["decode_ms_per_step_by_class"].items(),
                                                        key=lambda kv: -kv[1]))
      print(f"  generate {g['impl']} B={g['batch']} reduce_chunks={g['reduce_chunks']}: "
            f"{g['decode_tok_s']:,.0f} tok/s, "
            f"{g['ms_per_step']:.3f} ms/step; "
            f"decode device ms/step by class (prefill-only call subtracted): {cls}")


if __name__ == "__main__":
  main()
