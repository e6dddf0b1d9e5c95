"""Compile-only memory check of the learner step: does a preset x sequence length x mesh fit, before any GPU-hour?

  python -m kevin_jax.rl.memcheck --preset qwq-32b --seq-len 16384 --mesh fsdp=8 --micro-batch 1 --remat full

Nothing is allocated: the step is lowered for abstract, sharded inputs (jax.ShapeDtypeStruct) and compiled;
XLA's buffer assignment (`compiled.memory_analysis()`) then gives per-device bytes of the arguments (train
state + batch), the outputs, their aliasing (the donated state) and the temporaries (activations, gradients,
the fp32 gradient accumulator, logits chunks, collectives' buffers). Peak per device ~= args + outputs -
aliased + temps, plus what the runtime reserves (CUDA context, cuDNN/cuBLAS workspaces, ~1-3 GB).

Devices (--backend):
  gpu  on a GPU host. With fewer GPUs than the mesh needs, JAX's mock GPU topology
       (jax_mock_gpu_topology = "1x<n>x1", one visible GPU per mocked host) makes n devices to compile for:
       the GPU compiler, its fusions and collectives, so the numbers are the ones an n-GPU run gets (a
       multi-host-shaped NCCL layout, same per-device buffers).
  cpu  n fake CPU devices (--xla_force_host_platform_device_count): the same sharded program compiled by the
       CPU backend. Argument/output bytes are exact; temporaries are indicative only (different fusion and
       scheduling, no cuDNN attention, CPU may keep bf16 matmul operands in fp32).
  auto gpu when a CUDA GPU answers, else cpu.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from kevin_jax import cuda_driver


def _parse_mesh(text: str) -> tuple[tuple[str, int], ...]:
  axes = []
  for part in text.split(","):
    name, _, size = part.partition("=")
    if not size:
      raise SystemExit(f"--mesh wants name=size pairs like fsdp=8,tensor=1; got {text!r}")
    axes.append((name.strip(), int(size)))
  if any(s < 1 for _, s in axes):
    raise SystemExit("--mesh sizes must be explicit positive numbers here (no -1): the device count follows")
  return tuple(axes)


def setup_devices(backend: str, n: int) -> str:
  """Configures JAX (before it is imported) for n compile devices; returns the backend chosen."""
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  if getattr(xla_bridge, "backends_are_initialized", lambda: "jax" in sys.modules)():
    import jax  # pylint: disable=g-import-not-at-top
    if len(jax.devices()) >= n:
      return jax.default_backend()
    raise SystemExit(f"JAX is already initialised with {len(jax.devices())} devices; {n} needed")
  if backend == "auto":
    backend = "gpu" if cuda_driver.device_count() > 0 else "cpu"
  if backend == "gpu":
    have = cuda_driver.device_count()
    if have == 0:
      raise SystemExit("--backend gpu: no CUDA GPU answers (use --backend cpu)")
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if have < n:
      import jax  # pylint: disable=g-import-not-at-top
      # These are config flags, not environment variables: set before the GPU backend initialises.
      jax.config.update("jax_mock_gpu_topology", f"1x{n}x1")
      jax.config.update("jax_cuda_visible_devices", "0")
      # Autotuning runs candidate kernels on each device; mocked devices have none to run them on (the compile
      # hangs in backend_compile_and_load with JAX 0.11.2). Default GEMM configs change
      # workspaces by a few MiB, not the activations and state this check is about.
      flags = os.environ.get("XLA_FLAGS", "")
      if "xla_gpu_autotune_level" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_gpu_autotune_level=0".strip()
  else:
    os.environ["JAX_PLATFORMS"] = "cpu"
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
      os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
  return backend


def analyse(preset: str, seq_len: int, mesh_axes, *, micro_batch: int, remat: str, param_dtype: str,
            compute_dtype: str, state_dtype: str, attention: str, updates: int, batch: int | None,
            logits_chunk: int, scan_layers: bool | None = None, config_arg: str = "") -> dict:
  """Compiles the learner step abstractly and returns the memory report (a JSON-able dict)."""
  import jax  # pylint: disable=g-import-not-at-top
  from configs import multiturn  # pylint: disable=g-import-not-at-top
  from kevin_jax import sharding  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy.config import get_preset  # pylint: disable=g-import-not-at-top
  from kevin_jax.rl.learner import Learner  # pylint: disable=g-import-not-at-top

  n = math.prod(s for _, s in mesh_axes)
  devices = jax.devices()
  if len(devices) < n:
    raise SystemExit(f"mesh {dict(mesh_axes)} needs {n} devices, JAX has {len(devices)}")
  mesh = sharding.make_mesh(mesh_axes, devices[:n])
  config = multiturn.get_config(config_arg)
  config.rl.micro_batch_size = micro_batch
  config.rl.updates_per_batch = updates
  config.rl.logits_chunk = logits_chunk
  config.optimizer.state_dtype = state_dtype
  # Remat only lowers peak memory with scanned layers (the paper preset scans); None keeps them together.
  config.rl.scan_layers = remat != "none" if scan_layers is None else scan_layers
  model_cfg = get_preset(preset, param_dtype=param_dtype, compute_dtype=compute_dtype, remat=remat,
                         attention_impl=attention)
  learner = Learner.from_config(config, mesh, model_cfg=model_cfg)
  rows = batch or learner.rows_multiple()
  if rows % learner.rows_multiple():
    raise SystemExit(f"--batch must be a multiple of {learner.rows_multiple()}")
  t0 = time.time()
  compiled = learner.compile(rows, seq_len)
  seconds = time.time() - t0
  ma = compiled.memory_analysis()
  get = lambda k: int(getattr(ma, k, 0) or 0)
  arg, out, alias, temp = (get("argument_size_in_bytes"), get("output_size_in_bytes"),
                           get("alias_size_in_bytes"), get("temp_size_in_bytes"))

  def shard_bytes(tree):
    total = 0
    for x in jax.tree.leaves(tree):
      shape = x.sharding.shard_shape(x.shape)
      total += math.prod(shape) * x.dtype.itemsize
    return total

  st = learner.abstract_state
  return {
      "preset": preset, "params": model_cfg.num_params(), "seq_len": seq_len, "mesh": dict(mesh.shape),
      "devices": f"{n} x {devices[0].device_kind} ({jax.default_backend()})",
      "batch_rows": rows, "micro_batch_per_device": micro_batch, "updates_per_batch": updates,
      "remat": remat, "scan_layers": config.rl.scan_layers, "attention": attention, "param_dtype": param_dtype,
      "state_dtype": state_dtype,
      "master_weights": learner.use_master, "compile_seconds": round(seconds, 1),
      "per_device_bytes": {
          "arguments": arg, "outputs": out, "aliased": alias, "temporaries": temp,
          "peak_estimate": arg + out - alias + temp,
          "state_params": shard_bytes(st.params), "state_master": shard_bytes(st.master) if st.master else 0,
          "state_optimizer": shard_bytes(st.opt_state),
      },
  }


def _gib(x: int) -> str:
  return f"{x / 2**30:9.2f} GiB" if x >= 2**30 else f"{x / 2**20:9.2f} MiB"


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--preset", default="qwq-32b", help="model shape preset (kevin_jax/policy/config.py)")
  p.add_argument("--seq-len", type=int, default=16384, help="tokens per sample (prompt + response)")
  p.add_argument("--mesh", default="fsdp=8", help="mesh axes, e.g. fsdp=8 or fsdp=4,tensor=2")
  p.add_argument("--micro-batch", type=int, default=1, help="sequences per device per micro-batch")
  p.add_argument("--remat", default="full", choices=("none", "full", "dots"))
  p.add_argument("--scan-layers", default="auto", choices=("auto", "on", "off"),
                 help="scan the decoder layers (auto: on with remat, as in the paper preset)")
  p.add_argument("--param-dtype", default="bfloat16", choices=("bfloat16", "float32"))
  p.add_argument("--compute-dtype", default="bfloat16", choices=("bfloat16", "float32"))
  p.add_argument("--state-dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--attention", default="auto", choices=("auto", "xla", "cudnn"),
                 help="auto: cudnn on gpu, xla on cpu")
  p.add_argument("--updates", type=int, default=2, help="optimizer updates per rollout batch")
  p.add_argument("--batch", type=int, default=None, help="rows per rollout batch (default: the minimum)")
  p.add_argument("--logits-chunk", type=int, default=1024)
  p.add_argument("--backend", default="auto", choices=("auto", "gpu", "cpu"))
  p.add_argument("--hbm-gib", type=float, default=141.0, help="device memory to compare with (H200: 141)")
  p.add_argument("--json", default="", help="also write the report here")
  a = p.parse_args(argv)
  mesh_axes = _parse_mesh(a.mesh)
  backend = setup_devices(a.backend, math.prod(s for _, s in mesh_axes))
  attention = a.attention if a.attention != "auto" else ("cudnn" if backend == "gpu" else "xla")
  print(f"compiling the learner step for {a.preset}, {a.seq_len} tokens/sample, mesh {a.mesh} on {backend} "
        "(no weights are allocated) ...", flush=True)
  r = analyse(a.preset, a.seq_len, mesh_axes, micro_batch=a.micro_batch, remat=a.remat,
              param_dtype=a.param_dtype, compute_dtype=a.compute_dtype, state_dtype=a.state_dtype,
              attention=attention, updates=a.updates, batch=a.batch, logits_chunk=a.logits_chunk,
              scan_layers=None if a.scan_layers == "auto" else a.scan_layers == "on")
  r["backend"] = backend
  r["hbm_gib"] = a.hbm_gib
  b = r["per_device_bytes"]
  r["fits"] = b["peak_estimate"] < a.hbm_gib * 2**30
  if a.json:
    with open(a.json, "w") as f:
      json.dump(r, f, indent=2)
  print(f"{r['preset']} ({r['params'] / 1e9:.2f}B params) | {r['devices']} | mesh {r['mesh']} | "
        f"{r['batch_rows']} rows x {r['seq_len']} tokens | micro-batch {r['micro_batch_per_device']}/device | "
        f"remat {r['remat']} (scanned layers: {r['scan_layers']}) | attention {r['attention']} | "
        f"params {r['param_dtype']} "
        f"(fp32 master: {r['master_weights']}) | Adam moments {r['state_dtype']} | compile {r['compile_seconds']} s")
  print("per device:")
  for k in ("state_params", "state_master", "state_optimizer", "arguments", "outputs", "aliased", "temporaries",
            "peak_estimate"):
    print(f"  {k:<16}{_gib(b[k])}")
  verdict = "fits" if r["fits"] else "does NOT fit"
  note = " (cpu backend: temporaries are indicative, see --help)" if backend == "cpu" else ""
  print(f"peak estimate {_gib(b['peak_estimate']).strip()} vs {a.hbm_gib:.0f} GiB per device: {verdict}{note}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
