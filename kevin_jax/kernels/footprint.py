"""A task's memory footprint from its TaskInfo (meta-device shapes, nothing allocated), and the GPU worker's budget.

Torch-free, so the evaluator process, the learner's task loading and the workers share one formula.

`evaluation_bytes` is what one evaluation of a candidate holds on the GPU at its peak (worker.py, timing.py), with
P = parameter and buffer bytes, I = tensor-input bytes, O = output bytes, S = timing_input_sets (>= 2), W = max(I, O)
(the reference's intermediates, taken as one tensor as large as its inputs or outputs). Always resident: 3 P (the
reference model, the candidate's guarded copy of its parameters and their pristine snapshot); on top of that, the
largest of three phases that never overlap (each frees its tensors before the next):

  correctness, reference   3 I + 3 O + W   candidate buffers (I + O), the trial's draw, the reference's copy of it,
                                           the reference outputs and their sealed copy
  correctness, comparison  2 I + 5 O       candidate buffers, the draw, the sealed reference and first-run outputs,
                                           a mismatch's statistics (two temporaries as large as the output; so are
                                           the unsealed copies a non-float32 output's comparison makes)
  timing                   3 S I + 2 O + W  S candidate input sets, S rescaled base sets and S reference copies
                                           (fresh draws need less: keyed draws S + 1 sets, S + 1 + S with CUDA
                                           graphs; get_inputs() draws S + 1 and the next run's), candidate outputs,
                                           one reference output at a time (one stream: freed blocks are reused in
                                           order)

A task is skipped as a whole (`task_too_large`, an evaluator-side verdict, never the candidate's) when this exceeds
`task_memory_fraction` x the GPU's free memory.
"""

from __future__ import annotations

import dataclasses
import math

# Bytes per element of the dtypes TaskInfo records (taskinfo.dtype_name).
DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
               "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16, "float8_e4m3fn": 1,
               "float8_e5m2": 1, "uint16": 2, "uint32": 4, "uint64": 8}
DEFAULT_TIMING_INPUT_SETS = 2
TOO_LARGE_FLAG = "task_too_large"


@dataclasses.dataclass(frozen=True)
class TaskBytes:
  """Bytes of a task's tensor inputs, outputs and parameters (+ buffers), at its declared shapes."""
  inputs: int
  outputs: int
  params: int

  @property
  def total(self) -> int:
    return self.inputs + self.outputs + self.params


def _nbytes(shape, dtype: str) -> int:
  return math.prod(int(d) for d in shape) * DTYPE_BYTES.get(dtype, 8)  # Unknown dtype: 8 bytes (conservative).


def task_bytes(info) -> TaskBytes:
  """TaskBytes of a taskinfo.TaskInfo (or its to_dict())."""
  d = info if isinstance(info, dict) else info.to_dict()
  return TaskBytes(inputs=sum(_nbytes(i["shape"], i["dtype"]) for i in d["inputs"] if i["kind"] == "tensor"),
                   outputs=sum(_nbytes(o["shape"], o["dtype"]) for o in d["outputs"]),
                   params=sum(_nbytes(p["shape"], p["dtype"]) for p in d["params"].values()))


def evaluation_bytes(info, timing_input_sets: int = DEFAULT_TIMING_INPUT_SETS) -> int:
  """Peak GPU bytes of one evaluation (module docstring's formula)."""
  b = task_bytes(info)
  s = max(2, int(timing_input_sets))
  i, o, w = b.inputs, b.outputs, max(b.inputs, b.outputs)
  return 3 * b.params + max(3 * i + 3 * o + w, 2 * i + 5 * o, 3 * s * i + 2 * o + w)


def memory_budget_ok(info, free_bytes: int, fraction: float,
                     timing_input_sets: int = DEFAULT_TIMING_INPUT_SETS) -> bool:
  """True when one evaluation of the task fits `fraction` x `free_bytes` (fraction <= 0: no budget)."""
  return fraction <= 0 or evaluation_bytes(info, timing_input_sets) <= fraction * free_bytes


def too_large_message(task_id: str, need: int, free_bytes: int, fraction: float) -> str:
  gib = 2.0**30
  return (f"evaluator error: task {task_id} is too large for this GPU: one evaluation needs about "
          f"{need / gib:.2f} GiB (kevin_jax/kernels/footprint.py), over {fraction:g} x {free_bytes / gib:.2f} GiB "
          f"free (evaluator.task_memory_fraction); the task is skipped, not scored")


def too_large_result(task_id: str, info, free_bytes: int, fraction: float,
                     timing_input_sets: int = DEFAULT_TIMING_INPUT_SETS) -> dict | None:
  """The worker's result dict for a task over the budget (None when it fits): a task-level skip."""
  if info is None or memory_budget_ok(info, free_bytes, fraction, timing_input_sets):
    return None
  need = evaluation_bytes(info, timing_input_sets)
  return {"status": "runtime_error", "error": too_large_message(task_id, need, free_bytes, fraction),
          "flags": [TOO_LARGE_FLAG, "evaluator_error"], "fatal": False, "times": {},
          "details": {"task_bytes": dataclasses.asdict(task_bytes(info)), "evaluation_bytes": need,
                      "free_bytes": int(free_bytes), "task_memory_fraction": float(fraction)}}
