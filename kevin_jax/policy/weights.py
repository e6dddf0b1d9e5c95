"""Hugging Face Qwen2 checkpoints <-> our Flax NNX `Qwen2`, without torch.

  model = load_pretrained("/ckpts/QwQ-32B", dtype="bfloat16", shardings=shard_fn)
  save_pretrained(model, "/out/step_40")   # transformers' Qwen2ForCausalLM.from_pretrained loads it unchanged

Reading uses safetensors' numpy API (memory-mapped, one tensor at a time). Each tensor is transposed/reshaped to
our layout, cast, and placed straight into its target sharding with `jax.make_array_from_callback`, so every
device receives only its own shard and the host holds at most one full tensor at a time.

Name mapping (layer i; HF torch Linear weights are [out, in], ours are [in, ...out]):
  model.embed_tokens.weight                 [V, D]      -> embed.embedding              [V, D]
  model.layers.i.self_attn.q_proj.weight    [N*H, D]    -> layers.i.attn.q_kernel       [D, N, H]  (T, reshape)
  model.layers.i.self_attn.q_proj.bias      [N*H]       -> layers.i.attn.q_bias         [N, H]
  model.layers.i.self_attn.{k,v}_proj.*     [K*H, D]    -> layers.i.attn.{k,v}_kernel   [D, K, H]  (bias [K, H])
  model.layers.i.self_attn.o_proj.weight    [D, N*H]    -> layers.i.attn.o_kernel       [N, H, D]  (T, reshape)
  model.layers.i.mlp.{gate,up}_proj.weight  [F, D]      -> layers.i.mlp.{gate,up}_kernel [D, F]   (T)
  model.layers.i.mlp.down_proj.weight       [D, F]      -> layers.i.mlp.down_kernel     [F, D]     (T)
  model.layers.i.input_layernorm.weight     [D]         -> layers.i.input_norm.scale
  model.layers.i.post_attention_layernorm.weight        -> layers.i.post_attn_norm.scale
  model.norm.weight                         [D]         -> final_norm.scale
  lm_head.weight                            [V, D]      -> lm_head.kernel               [D, V]     (T; untied only)
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import jax
import ml_dtypes
import numpy as np
from flax import nnx

from kevin_jax.policy.config import ModelConfig
from kevin_jax.policy.model import Qwen2

PathParts = tuple[Any, ...]
# A sharding for every parameter: one Sharding for all, a callable (path, logical_names, shape) -> Sharding,
# or a tree shaped like nnx.state(model, nnx.Param) whose leaves are Shardings.
ShardingSpec = Any

_SINGLE_FILE = "model.safetensors"
_INDEX_FILE = "model.safetensors.index.json"
_FLOAT_DTYPES = {np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float64)}


def _mapping(cfg: ModelConfig) -> dict[str, tuple[PathParts, Callable, Callable, tuple[int, ...]]]:
  """HF name -> (our path, hf_to_ours(np) fn, ours_to_hf(np) fn, HF shape)."""
  d, f, n, k, h, v = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                      cfg.vocab_size)
  ident = lambda x: x
  transpose = lambda x: np.ascontiguousarray(x.T)

  def kernel_in(heads):  # [heads*H, D] -> [D, heads, H]
    return (lambda x: np.ascontiguousarray(x.T).reshape(d, heads, h)), (lambda x: np.ascontiguousarray(
        x.reshape(d, heads * h).T))

  def bias(heads):
    return (lambda x: x.reshape(heads, h)), (lambda x: x.reshape(heads * h))

  o_in = lambda x: np.ascontiguousarray(x.T).reshape(n, h, d)  # [D, N*H] -> [N, H, D]
  o_out = lambda x: np.ascontiguousarray(x.reshape(n * h, d).T)
  m = {
      "model.embed_tokens.weight": (("embed", "embedding"), ident, ident, (v, d)),
      "model.norm.weight": (("final_norm", "scale"), ident, ident, (d,)),
  }
  if not cfg.tie_word_embeddings:
    m["lm_head.weight"] = (("lm_head", "kernel"), transpose, transpose, (v, d))
  for i in range(cfg.num_layers):
    p = f"model.layers.{i}."
    for proj, heads in (("q", n), ("k", k), ("v", k)):
      m[p + f"self_attn.{proj}_proj.weight"] = (("layers", i, "attn", f"{proj}_kernel"), *kernel_in(heads),
                                                (heads * h, d))
      m[p + f"self_attn.{proj}_proj.bias"] = (("layers", i, "attn", f"{proj}_bias"), *bias(heads), (heads * h,))
    m[p + "self_attn.o_proj.weight"] = (("layers", i, "attn", "o_kernel"), o_in, o_out, (d, n * h))
    m[p + "mlp.gate_proj.weight"] = (("layers", i, "mlp", "gate_kernel"), transpose, transpose, (f, d))
    m[p + "mlp.up_proj.weight"] = (("layers", i, "mlp", "up_kernel"), transpose, transpose, (f, d))
    m[p + "mlp.down_proj.weight"] = (("layers", i, "mlp", "down_kernel"), transpose, transpose, (d, f))
    m[p + "input_layernorm.weight"] = (("layers", i, "input_norm", "scale"), ident, ident, (d,))
    m[p + "post_attention_layernorm.weight"] = (("layers", i, "post_attn_norm", "scale"), ident, ident, (d,))
  return m


def _tensor_files(path: str) -> dict[str, str]:
  """HF tensor name -> safetensors file, from model.safetensors or the sharded index."""
  index = os.path.join(path, _INDEX_FILE)
  single = os.path.join(path, _SINGLE_FILE)
  if os.path.isfile(index):
    with open(index) as fh:
      weight_map = json.load(fh).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
      raise ValueError(f"{index} has no 'weight_map'")
    missing = sorted({fn for fn in weight_map.values() if not os.path.isfile(os.path.join(path, fn))})
    if missing:
      raise FileNotFoundError(f"{index} names shard files that do not exist in {path}: {missing}")
    return {name: os.path.join(path, fn) for name, fn in weight_map.items()}
  if os.path.isfile(single):
    from safetensors import safe_open  # pylint: disable=g-import-not-at-top
    with safe_open(single, framework="numpy") as fh:
      return {name: single for name in fh.keys()}
  if any(fn.endswith((".bin", ".pt", ".pth")) for fn in os.listdir(path)):
    raise FileNotFoundError(f"{path} holds PyTorch pickle weights only; convert them to safetensors first")
  raise FileNotFoundError(f"no {_SINGLE_FILE} or {_INDEX_FILE} in {path}")


def _resolve_sharding(shardings: ShardingSpec, path: PathParts, names: tuple[str, ...], shape, tree_flat):
  if shardings is None:
    return jax.sharding.SingleDeviceSharding(jax.devices()[0])
  if isinstance(shardings, jax.sharding.Sharding):
    return shardings
  if callable(shardings):
    return shardings(path, names, shape)
  leaf = tree_flat[path]
  return leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf


def abstract_model(cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
  """GraphDef and abstract (ShapeDtypeStruct) state of Qwen2(cfg): no memory allocated."""
  model = nnx.eval_shape(lambda: Qwen2(cfg, rngs=nnx.Rngs(0)))
  return nnx.split(model)


def load_pretrained(path: str | os.PathLike, *, dtype: str | None = "bfloat16", shardings: ShardingSpec = None,
                    **config_overrides: Any) -> Qwen2:
  """Loads a local Hugging Face Qwen2 checkpoint into our model.

  Args:
    path: directory with config.json and model.safetensors (or model.safetensors.index.json + shards).
    dtype: parameter dtype ('bfloat16' | 'float32'); None keeps the config default. Floating tensors are cast.
    shardings: where to place each parameter: None (first device), one `jax.sharding.Sharding` for all, a
      callable `(path_parts, logical_names, shape) -> Sharding`, or a tree like `nnx.state(model, nnx.Param)`
      with a Sharding per leaf. Each tensor goes straight to its shards.
    **config_overrides: ModelConfig runtime fields (compute_dtype, remat, attention_impl, ...).

  Returns:
    The Qwen2 module with loaded weights (`model.cfg` holds the config).

  Raises:
    FileNotFoundError: missing directory, config.json or safetensors files.
    ValueError: unsupported architecture, missing or unknown tensors, shape or dtype mismatches.
  """
  path = os.fspath(path)
  if not os.path.isdir(path):
    raise FileNotFoundError(f"checkpoint directory {path} does not exist")
  if dtype is not None:
    config_overrides["param_dtype"] = dtype
  cfg = ModelConfig.from_hf_config(path, **config_overrides)
  files = _tensor_files(path)
  mapping = _mapping(cfg)
  expected = set(mapping)
  present = set(files)
  ignorable = {"lm_head.weight"} if cfg.tie_word_embeddings else set()  # tied models may still store it
  unknown = sorted(present - expected - ignorable)
  missing = sorted(expected - present)
  if unknown or missing:
    raise ValueError(f"checkpoint {path} does not match a Qwen2 with {cfg.num_layers} layers "
                     f"(tie_word_embeddings={cfg.tie_word_embeddings}): "
                     f"missing tensors {missing[:8]}{'...' if len(missing) > 8 else ''} ({len(missing)}), "
                     f"unknown tensors {unknown[:8]}{'...' if len(unknown) > 8 else ''} ({len(unknown)})")

  graphdef, abs_state = abstract_model(cfg)
  flat = dict(nnx.to_flat_state(abs_state))
  tree_flat = None
  if shardings is not None and not isinstance(shardings, jax.sharding.Sharding) and not callable(shardings):
    tree = shardings if isinstance(shardings, nnx.State) else nnx.State(shardings)
    tree_flat = dict(nnx.to_flat_state(tree))
  target_dtype = np.dtype(cfg.param_jnp_dtype)

  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  by_file: dict[str, list[str]] = {}
  for name in sorted(expected):
    by_file.setdefault(files[name], []).append(name)
  values: dict[PathParts, jax.Array] = {}
  for fn, names in by_file.items():
    with safe_open(fn, framework="numpy") as fh:
      for name in names:
        ours, to_ours, _, hf_shape = mapping[name]
        arr = fh.get_tensor(name)
        if tuple(arr.shape) != hf_shape:
          raise ValueError(f"{name} in {fn}: shape {tuple(arr.shape)}, expected {hf_shape} from config.json")
        if arr.dtype not in _FLOAT_DTYPES:
          raise ValueError(f"{name} in {fn}: dtype {arr.dtype} is not a floating type")
        arr = to_ours(arr).astype(target_dtype)
        var = flat[ours]
        if arr.shape != var.shape:
          raise AssertionError(f"internal mapping error for {name}: {arr.shape} vs {var.shape}")
        sharding = _resolve_sharding(shardings, ours, var.get_metadata().get("out_sharding"), arr.shape, tree_flat)
        values[ours] = jax.make_array_from_callback(arr.shape, sharding, lambda idx, a=arr: a[idx])
  for p, var in flat.items():
    flat[p] = var.replace(values[p])
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


def _to_host(x: jax.Array) -> np.ndarray:
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    x = multihost_utils.process_allgather(x, tiled=True)
  return np.asarray(jax.device_get(x))


def save_pretrained(model: Qwen2, path: str | os.PathLike, *, dtype: str | None = None,
                    max_shard_bytes: int = 5 * 2**30, config_extra: dict[str, Any] | None = None) -> None:
  """Writes `model` as a Hugging Face checkpoint (config.json + safetensors) that transformers loads unchanged.

  Args:
    model: the Qwen2 module (parameters may be sharded; they are gathered one tensor at a time and written
      one shard file at a time; with several processes every process must call this and only process 0
      writes).
    path: output directory (created; existing weight files in it are overwritten).
    dtype: dtype of the stored tensors; None = the model's param_dtype.
    max_shard_bytes: split into model-0000i-of-0000n.safetensors + index when the total exceeds this.
    config_extra: extra config.json entries (e.g. {'eos_token_id': 151645}).
  """
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  path = os.fspath(path)
  writer = jax.process_index() == 0  # every process joins the gathers; only process 0 writes files
  if writer:
    os.makedirs(path, exist_ok=True)
  cfg = model.cfg
  out_dtype = np.dtype(dtype or cfg.param_dtype)
  flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  mapping = _mapping(cfg)
  # Stream: each shard file is written as soon as it is full, so the host holds at most ~max_shard_bytes.
  parts: list[tuple[str, list[str], int]] = []  # (temporary file, tensor names, bytes)
  current: dict[str, np.ndarray] = {}

  def flush():
    if current and writer:
      tmp = os.path.join(path, f".part-{len(parts):05d}.safetensors")
      save_file(current, tmp, metadata={"format": "pt"})
      parts.append((tmp, list(current), sum(a.nbytes for a in current.values())))
    current.clear()

  for name, (ours, _, to_hf, hf_shape) in mapping.items():
    arr = np.ascontiguousarray(to_hf(_to_host(flat[ours].get_value())).astype(out_dtype))
    assert arr.shape == hf_shape, (name, arr.shape, hf_shape)
    if current and sum(a.nbytes for a in current.values()) + arr.nbytes > max_shard_bytes:
      flush()
    current[name] = arr
  flush()
  if not writer:
    return
  for fn in os.listdir(path):  # stale weights of an earlier save would confuse loaders
    if fn == _SINGLE_FILE or fn == _INDEX_FILE or (fn.startswith("model-") and fn.endswith(".safetensors")):
      os.remove(os.path.join(path, fn))
  if len(parts) == 1:
    os.replace(parts[0][0], os.path.join(path, _SINGLE_FILE))
  else:
    weight_map, total = {}, 0
    for i, (tmp, names, nbytes) in enumerate(parts):
      fn = f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"
      os.replace(tmp, os.path.join(path, fn))
      weight_map.update({name: fn for name in names})
      total += nbytes
    with open(os.path.join(path, _INDEX_FILE), "w") as fh:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh, indent=2)
  hf = cfg.to_hf_config(**(config_extra or {}))
  hf["torch_dtype"] = hf["dtype"] = str(out_dtype.name)
  with open(os.path.join(path, "config.json"), "w") as fh:
    json.dump(hf, fh, indent=2)
