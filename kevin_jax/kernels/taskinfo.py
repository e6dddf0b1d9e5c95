"""What a plan may refer to in a task: input/output/parameter shapes and dtypes, constructor scalars, options.

`analyze_task` builds a `TaskInfo` without a GPU by running the task on PyTorch's meta device (shapes only, no
compute; falls back to a real CPU run when an op has no meta kernel); the model is in the reference mode
(`as_reference`), as everywhere the evaluator builds a reference. The GPU worker builds the same record from the live
model (`from_live`). Both feed `TaskInfo.plan_env()`, the names `plan.bind_plan` resolves.

Task-level options (module attributes of a task file, all optional):
  ALLOW_TF32 = True            the reference may use TF32 (default: IEEE fp32 for matmul and convolution)
  ATOL = 1e-3; RTOL = 1e-3     tolerances for this task's floating outputs (default: the evaluator's, per dtype)
  INPUT_DISTRIBUTIONS = (...)  correctness-trial distributions, e.g. ("task",) for inputs with structure
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any

from kevin_jax.kernels import tasks
from kevin_jax.kernels.plan import PlanEnv, TensorMeta


# Input distributions for correctness trials (inputs.py implements them; listed here, torch-free, for configs).
DISTRIBUTIONS = ("task", "normal", "uniform", "heavy", "shifted", "shrunk")


class TaskError(RuntimeError):
  """The task itself is unusable (import error, no tensor outputs, ...): not the candidate's fault."""


@dataclasses.dataclass
class TaskInfo:
  task_id: str
  input_names: list[str]  # One per forward argument, in order.
  inputs: list[dict]  # {'kind': 'tensor', 'shape', 'dtype'} or {'kind': 'scalar', 'value'}.
  outputs: list[dict]  # {'shape', 'dtype'}.
  params: dict[str, dict]  # Parameter/buffer name -> {'shape', 'dtype'}.
  init_args: dict[str, Any]  # Constructor scalars by __init__ parameter name.
  options: dict[str, Any]  # allow_tf32, atol, rtol, input_distributions (None = evaluator default).

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, d: dict) -> "TaskInfo":
    return cls(**d)

  @property
  def output_names(self) -> list[str]:
    return [f"out{i}" for i in range(len(self.outputs))]

  def plan_env(self) -> PlanEnv:
    """Names for the plan: inputs (by name and in<i>), outputs (out<i>, `out` if single), params, init args."""
    tensors: dict[str, TensorMeta] = {}
    scalars: dict[str, Any] = {}
    aliases: dict[str, str] = {}
    for name, p in self.params.items():
      tensors[name] = TensorMeta(tuple(p["shape"]), p["dtype"], "param")
    for name, v in self.init_args.items():
      if name not in tensors:
        scalars[name] = v
    for i, (name, inp) in enumerate(zip(self.input_names, self.inputs)):
      if inp["kind"] == "tensor":
        tensors.pop(name, None)
        scalars.pop(name, None)
        tensors[name] = TensorMeta(tuple(inp["shape"]), inp["dtype"], "input")
      else:
        scalars[name] = inp["value"]
      if name != f"in{i}":
        aliases[f"in{i}"] = name
    for i, out in enumerate(self.outputs):
      tensors[f"out{i}"] = TensorMeta(tuple(out["shape"]), out["dtype"], "output")
    if len(self.outputs) == 1:
      aliases["out"] = "out0"
    for alias in [a for a in aliases if a in tensors or a in scalars]:
      del aliases[alias]  # A real name wins over an alias.
    return PlanEnv(tensors=tensors, scalars=scalars, aliases=aliases)

  def describe(self) -> str:
    """One line per name, for error messages and prompts."""
    lines = [f"input {n}: {i['dtype']}{list(i['shape'])}" if i["kind"] == "tensor" else f"input {n} = {i['value']}"
             for n, i in zip(self.input_names, self.inputs)]
    lines += [f"output out{k}: {o['dtype']}{list(o['shape'])}" for k, o in enumerate(self.outputs)]
    lines += [f"param {n}: {p['dtype']}{list(p['shape'])}" for n, p in self.params.items()]
    lines += [f"init {n} = {v}" for n, v in self.init_args.items()]
    return "\n".join(lines)


def as_reference(model):
  """The model in the evaluator's reference mode: as built (training mode, as KernelBench's harness runs it, so
  BatchNorm normalises with the batch's statistics), except that Dropout modules and the dropout inside
  MultiheadAttention are switched off (eval()), so the reference is a function of its inputs and the same on every
  call (kernels/README.md "The reference"). Every place that builds a reference calls this."""
  import torch  # pylint: disable=g-import-not-at-top

  for sub in model.modules():
    if isinstance(sub, (torch.nn.modules.dropout._DropoutNd, torch.nn.MultiheadAttention)):  # pylint: disable=protected-access
      sub.eval()
  return model


def dtype_name(dtype) -> str:
  return str(dtype).replace("torch.", "")


def task_options(module) -> dict:
  dists = getattr(module, "INPUT_DISTRIBUTIONS", None)
  return {"allow_tf32": bool(getattr(module, "ALLOW_TF32", False)),
          "atol": _opt_float(module, "ATOL"), "rtol": _opt_float(module, "RTOL"),
          "input_distributions": list(dists) if dists is not None else None}


def _opt_float(module, name):
  v = getattr(module, name, None)
  return None if v is None else float(v)


def forward_input_names(model_cls, n_inputs: int) -> list[str]:
  """Argument names of Model.forward (in<i> for *args or extra positional inputs)."""
  names = []
  try:
    sig = inspect.signature(model_cls.forward)
    for p in list(sig.parameters.values())[1:]:
      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
        names.append(p.name)
  except (TypeError, ValueError):
    pass
  names = names[:n_inputs]
  return names + [f"in{i}" for i in range(len(names), n_inputs)]


def init_arg_scalars(model_cls, init_inputs) -> dict[str, Any]:
  """Constructor arguments (positional values from get_init_inputs, then defaults) that are plain scalars."""
  out: dict[str, Any] = {}
  try:
    params = list(inspect.signature(model_cls.__init__).parameters.values())[1:]
  except (TypeError, ValueError):
    return out
  values = list(init_inputs)
  for k, p in enumerate(params):
    if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
      continue
    v = values[k] if k < len(values) else p.default
    if v is inspect.Parameter.empty:
      continue
    if isinstance(v, bool) or (isinstance(v, (int, float)) and math.isfinite(v)):
      out[p.name] = v
  return out


def _as_tuple(out) -> tuple:
  return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def describe_live(task_id: str, module, model, inputs, outputs) -> TaskInfo:
  """TaskInfo from real (or meta) objects: the module, the built model, one input list and its outputs."""
  import torch  # pylint: disable=g-import-not-at-top
  names = forward_input_names(module.Model, len(inputs))
  ins = []
  for x in inputs:
    if isinstance(x, torch.Tensor):
      ins.append({"kind": "tensor", "shape": list(x.shape), "dtype": dtype_name(x.dtype)})
    elif isinstance(x, (bool, int, float)):
      ins.append({"kind": "scalar", "value": x})
    else:
      raise TaskError(f"task {task_id}: input of type {type(x).__name__} is not supported (tensors and scalars)")
  outs = []
  for k, o in enumerate(_as_tuple(outputs)):
    if not isinstance(o, torch.Tensor):
      raise TaskError(f"task {task_id}: output {k} is a {type(o).__name__}, not a tensor")
    outs.append({"shape": list(o.shape), "dtype": dtype_name(o.dtype)})
  params = {n: {"shape": list(p.shape), "dtype": dtype_name(p.dtype)}
            for n, p in list(model.named_parameters()) + list(model.named_buffers())}
  return TaskInfo(task_id=task_id, input_names=names, inputs=ins, outputs=outs, params=params,
                  init_args=init_arg_scalars(module.Model, module.get_init_inputs()),
                  options=task_options(module))


def analyze_task(spec: tasks.TaskSpec) -> TaskInfo:
  """Shapes of a task without a GPU (meta device; a real CPU run if some op has no meta kernel).

  Raises:
    TaskError: the task cannot be imported or run.
  """
  import torch  # pylint: disable=g-import-not-at-top
  try:
    module = tasks.load_module(spec)
  except Exception as e:  # pylint: disable=broad-except
    raise TaskError(f"task {spec.id} failed to import: {type(e).__name__}: {e}") from e
  errors = []
  for device in ("meta", "cpu"):
    try:
      with torch.device(device), torch.no_grad():
        torch.manual_seed(0)
        model = as_reference(module.Model(*module.get_init_inputs()))
        inputs = list(module.get_inputs())
        outputs = model(*inputs)
      return describe_live(spec.id, module, model, inputs, outputs)
    except TaskError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      errors.append(f"{device}: {type(e).__name__}: {e}")
  raise TaskError(f"task {spec.id} could not be run to find its shapes ({'; '.join(errors)})")
