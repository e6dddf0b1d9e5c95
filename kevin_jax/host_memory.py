"""Host memory of a job on JAX's CPU backend, estimated from its shapes and checked before the job starts.

On the CPU, device arrays live in host memory, and a job larger than the machine is killed by the kernel's OOM
killer without a word, minutes in. `check` estimates the peak of each phase of a job from the config's shapes and
stops a job whose largest phase, plus the runtime, exceeds the memory available, naming the fields to lower. On
a GPU the device memory binds instead: XLA reports RESOURCE_EXHAUSTED itself, and kevin_jax/rl/memcheck.py gives
compile-time numbers before a run.

The estimate follows XLA's CPU buffer assignment (`compiled.memory_analysis()`; tests/test_host_memory.py keeps it
at 1-1.3x of XLA's figure for the tiny policy):
  a train step (the RL learner, the SFT warm start) on micro-batches of R rows (micro_batch_size x data-parallel
  devices) of T tokens keeps for its backward pass 3.5 x R*N*T^2 fp32 attention scores and probabilities per
  layer (one layer with remat and scanned layers), 3 x R*chunk*V fp32 logits (a chunk, its softmax and its
  gradient) and R*T*(10 D + 4 F) activations per layer, beside the parameters, the fp32 master copy, the Adam
  moments and two fp32 gradient trees;
  the sampler's prefill of B prompts padded to P tokens holds 2.2 x B*N*P^2 fp32 scores (one layer at a time)
  and the [L, 2, B, K, P + new, H] KV cache;
  the runtime (Python, JAX/XLA, compiled programs) takes about 1 GiB.
"""

from __future__ import annotations

import dataclasses
import os

from kevin_jax.policy.config import ModelConfig

GIB = 2**30
RUNTIME_BYTES = GIB  # Python, JAX/XLA and the compiled programs of a tiny policy (measured ~0.6-0.9 GiB).
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclasses.dataclass(frozen=True)
class Phase:
  """One phase's estimated peak (bytes, runtime excluded) and the config fields that set its shape."""
  name: str
  bytes: int
  shape: str  # E.g. "micro-batches of 8 rows x 5120 tokens".
  fields: tuple[str, ...]  # The fields to lower, the one that helps most first.


def train_step_bytes(cfg: ModelConfig, rows: int, seq_len: int, *, logits_chunk: int, master: bool,
                     state_dtype: str, scan_layers: bool) -> int:
  """A train step's peak on micro-batches of `rows` x `seq_len` (module docstring)."""
  act = _BYTES[cfg.compute_dtype]
  layers_kept = 1 if (cfg.remat != "none" and scan_layers) else cfg.num_layers
  scores = 3.5 * rows * cfg.num_heads * seq_len**2 * 4 * layers_kept
  logits = 3 * rows * min(logits_chunk, seq_len) * cfg.vocab_size * 4
  linear = rows * seq_len * (10 * cfg.hidden_size + 4 * cfg.intermediate_size) * act * cfg.num_layers
  p = cfg.num_params()
  state = p * (_BYTES[cfg.param_dtype] + (4 if master else 0) + 2 * _BYTES[state_dtype] + 2 * 4)
  return int(scores + logits + linear + state)


def prefill_bytes(cfg: ModelConfig, batch: int, prompt_len: int, new_tokens: int, cache_dtype: str) -> int:
  """The sampler's prefill of `batch` prompts padded to `prompt_len` (module docstring)."""
  scores = 2.2 * batch * cfg.num_heads * prompt_len**2 * 4
  cache = 2 * cfg.num_layers * batch * cfg.num_kv_heads * (prompt_len + new_tokens) * cfg.head_dim
  state = cfg.num_params() * _BYTES[cfg.param_dtype]
  return int(scores + cache * _BYTES[cache_dtype] + state)


def phases(config, cfg: ModelConfig, data_parallel: int, *, warm_start: bool, rl: bool) -> list[Phase]:
  """The phases a job runs: the warm start's step (warm_start), the RL learner's step (rl), and sampling."""
  from kevin_jax.rl.batch import seq_bucket  # pylint: disable=g-import-not-at-top
  s, r, smp = config.sft, config.rl, config.sampler
  master = cfg.param_dtype != "float32" and config.optimizer.master_weights
  step = dict(logits_chunk=r.logits_chunk, master=master, state_dtype=config.optimizer.state_dtype,
              scan_layers=r.scan_layers)
  out = []
  if warm_start:
    rows = s.micro_batch_size * data_parallel
    out.append(Phase("the warm start's train step", train_step_bytes(cfg, rows, s.max_seq_len, **step),
                     f"micro-batches of {rows} rows x {s.max_seq_len} tokens",
                     ("sft.max_seq_len", "sft.micro_batch_size")))
  if rl:
    rows = r.micro_batch_size * data_parallel
    t = seq_bucket(config.rollout.max_context_tokens + smp.max_new_tokens)
    out.append(Phase("the RL learner's step", train_step_bytes(cfg, rows, t, **step),
                     f"micro-batches of {rows} rows x {t} tokens",
                     ("rollout.max_context_tokens + sampler.max_new_tokens", "rl.micro_batch_size")))
  buckets = sorted(smp.prompt_buckets)
  longest = min(config.rollout.max_context_tokens, buckets[-1])
  p = next(b for b in buckets if b >= longest)
  batch = -(-smp.batch_size // data_parallel) * data_parallel
  new = max(smp.max_new_tokens, s.sample_max_new_tokens if warm_start else 0)
  out.append(Phase("the sampler's prefill", prefill_bytes(cfg, batch, p, new, smp.kv_cache_dtype),
                   f"{batch} prompts x {p} tokens", ("sampler.batch_size", "rollout.max_context_tokens")))
  return out


def available_bytes() -> int:
  """Memory this process may still take: MemAvailable, capped by a cgroup's limit minus its non-reclaimable use."""
  avail = _meminfo("MemAvailable")
  if avail is None:
    avail = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
  for d, limit, usage, cache in (("/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"),
                                 ("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes",
                                  "total_inactive_file")):
    try:
      with open(os.path.join(d, limit), encoding="ascii") as f:
        cap = f.read().strip()
      with open(os.path.join(d, usage), encoding="ascii") as f:
        used = int(f.read().strip())
      with open(os.path.join(d, "memory.stat"), encoding="ascii") as f:
        stat = dict(line.split() for line in f if len(line.split()) == 2)
    except (OSError, ValueError):
      continue
    if cap.isdigit() and int(cap) < 2**60:  # "max" or a huge number: no limit.
      avail = min(avail, int(cap) - used + int(stat.get(cache, 0)))
  return avail


def _meminfo(key: str) -> int | None:
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      for line in f:
        if line.startswith(key + ":"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def check(config, cfg: ModelConfig, data_parallel: int, *, warm_start: bool, rl: bool) -> list[Phase]:
  """Raises SystemExit before a CPU job whose estimated peak exceeds the available memory; returns the phases."""
  from absl import logging  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  if jax.default_backend() != "cpu":
    return []
  ps = phases(config, cfg, data_parallel, warm_start=warm_start, rl=rl)
  worst = max(ps, key=lambda p: p.bytes)
  need = worst.bytes + RUNTIME_BYTES
  have = available_bytes()
  logging.info("host memory: about %.1f GiB needed at peak (%s, %s), %.1f GiB available", need / GIB,
               worst.name, worst.shape, have / GIB)
  if need > have:
    detail = "; ".join(f"{p.name}: {p.bytes / GIB:.1f} GiB ({p.shape}; {', '.join(p.fields)})" for p in ps)
    raise SystemExit(
        f"error: this job needs about {need / GIB:.1f} GiB of host memory at its peak and {have / GIB:.1f} GiB are "
        f"available (JAX runs on the CPU, where device arrays live in host memory), so it stops before starting. "
        f"The largest phase is {worst.name} ({worst.shape}), whose memory grows with rows x tokens^2 (XLA "
        f"attention's fp32 scores). Lower {' or '.join(worst.fields)}, use a smaller policy.preset, or start from "
        f"a config's ':runlocal' preset. Per phase, plus {RUNTIME_BYTES / GIB:.0f} GiB of runtime: {detail}.")
  return ps
