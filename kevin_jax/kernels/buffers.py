"""Candidate-side GPU buffers: guard bands with secret canaries, poison, sealing, mutation and guard checks.

Every tensor a candidate sees (inputs, parameters, outputs, scratch) is its own allocation laid out as
[guard | data | pad to 256 B + guard]. Each guard holds its own random bytes, drawn again before every run of the
plan (`rearm`), so no guard tells a kernel what any other guard, or the same guard in a later run, contains; the
guards are compared after every launch (out-of-bounds writes). Outputs and scratch are filled with a poison byte
before every run: 0xFF (NaN for every float dtype) on the first run and 0x5A (a finite, unlikely value) on the
second, so elements a kernel never writes are found either as NaN or as the exact poison value. `seal` XORs a
buffer with a secret byte stream regenerated from a seed held only on the host (keyed_draw.py's keyed hash), so a
kept copy is useless to later launches; `count_bad_sealed` compares sealed tensors without unsealing them.
"""

from __future__ import annotations

import dataclasses

import torch

from kevin_jax.kernels import closeness
from kevin_jax.kernels import keyed_draw as KD
from kevin_jax.kernels.closeness import count_bad

GUARD_BYTES = 64 * 1024
ALIGN = 256
POISON_NAN = 0xFF  # First run: NaN in fp32/fp64/fp16/bf16, -1 in integers.
POISON_FINITE = 0x5A  # Second run: 1.5e16 (fp32), 203.25 (fp16), ...
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
          "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8, "bool": torch.bool, "int8": torch.int8,
          "int16": torch.int16}
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bytes_of(t: torch.Tensor) -> torch.Tensor:
  """A flat uint8 view of a contiguous tensor's bytes."""
  return t.reshape(-1).view(torch.uint8)


def poison_value_count(t: torch.Tensor, byte: int) -> int:
  """Elements whose bytes all equal `byte` (outputs never written after a poison fill)."""
  size = t.element_size()
  if t.numel() == 0:
    return 0
  pattern = int.from_bytes(bytes([byte]) * size, "little", signed=size > 1)
  if size == 1:
    pattern = byte
  return int((t.reshape(-1).view(_INT_VIEW[size]) == pattern).sum().item())


@dataclasses.dataclass
class Guarded:
  """One guarded allocation; `tensor` is the data view the kernel gets a pointer to."""
  name: str
  raw: torch.Tensor
  tensor: torch.Tensor
  nbytes: int

  @property
  def head(self) -> torch.Tensor:
    return self.raw[:GUARD_BYTES]

  @property
  def tail(self) -> torch.Tensor:
    return self.raw[GUARD_BYTES + self.nbytes:]

  @property
  def ptr(self) -> int:
    return self.tensor.data_ptr() if self.nbytes else self.raw.data_ptr() + GUARD_BYTES


class BufferSet:
  """All buffers of one evaluation (one GPU, one stream); guard canaries drawn per buffer, side and run."""

  def __init__(self, device: torch.device, gen: torch.Generator):
    self.device = device
    self.gen = gen
    self.buffers: dict[str, Guarded] = {}
    self.expect: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # Name -> (head, tail) canaries.
    self.param_snapshot: dict[str, torch.Tensor] = {}  # Parameter copies as handed to the candidate.

  def alloc(self, name: str, shape, dtype: torch.dtype) -> Guarded:
    numel = 1
    for s in shape:
      numel *= int(s)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    pad = (-nbytes) % ALIGN
    raw = torch.empty(GUARD_BYTES + nbytes + pad + GUARD_BYTES, dtype=torch.uint8, device=self.device)
    data = raw[GUARD_BYTES:GUARD_BYTES + nbytes].view(dtype).view(tuple(int(s) for s in shape))
    g = Guarded(name=name, raw=raw, tensor=data, nbytes=nbytes)
    self.buffers[name] = g
    self._arm([g])
    return g

  def rearm(self) -> None:
    """Fresh random canaries in every guard (before each run of the plan)."""
    self._arm(list(self.buffers.values()))

  def _arm(self, items: list[Guarded]) -> None:
    sizes = [(GUARD_BYTES, g.tail.numel()) for g in items]
    total = sum(a + b for a, b in sizes)
    if not total:
      return
    fresh = torch.randint(0, 256, (total,), dtype=torch.uint8, device=self.device, generator=self.gen)
    off = 0
    for g, (a, b) in zip(items, sizes):
      head, tail = fresh[off:off + a], fresh[off + a:off + a + b]
      off += a + b
      g.head.copy_(head)
      g.tail.copy_(tail)
      self.expect[g.name] = (head, tail)

  def __getitem__(self, name: str) -> Guarded:
    return self.buffers[name]

  def pointers(self) -> dict[str, int]:
    return {n: g.ptr for n, g in self.buffers.items()}

  def guard_counts(self) -> tuple[list[Guarded], torch.Tensor | None]:
    """The changed bytes of every guard, counted on the device (queued on the stream; no sync)."""
    items = list(self.buffers.values())
    if not items:
      return items, None
    counts = []
    for g in items:
      head, tail = self.expect[g.name]
      counts.append((g.head != head).sum())
      counts.append((g.tail != tail).sum())
    return items, torch.stack(counts)

  def guard_violations(self, counted=None) -> list[tuple[str, str, int]]:
    """(buffer, 'before'|'after', changed bytes) for every guard that no longer matches (one sync).

    `counted`: a `guard_counts()` queued earlier (e.g. right after a launch, before waiting for it); else now.
    """
    items, counts = counted if counted is not None else self.guard_counts()
    if counts is None:
      return []
    host = counts.cpu().tolist()
    out = []
    for k, g in enumerate(items):
      if host[2 * k]:
        out.append((g.name, "before", int(host[2 * k])))
      if host[2 * k + 1]:
        out.append((g.name, "after", int(host[2 * k + 1])))
    return out

  def fill(self, names, byte: int) -> None:
    for n in names:
      g = self.buffers[n]
      if g.nbytes:
        g.raw[GUARD_BYTES:GUARD_BYTES + g.nbytes].fill_(byte)


def seal(t: torch.Tensor, seed: int) -> None:
  """XORs a contiguous tensor's bytes in place with a secret stream (seed stays on the host); seal again to undo.

  The stream is keyed_draw.py's keyed byte stream of `seed`, regenerated where it is applied: on CUDA inside one
  pass (no copy of it in GPU memory), on the CPU zero-filled once used.
  """
  if t.numel() == 0:
    return
  b = bytes_of(t)
  _xor_stream(b, b, seed)


def sealed_copy(t: torch.Tensor, seed: int) -> torch.Tensor:
  """A new contiguous tensor holding `seal(t.clone(), seed)`, written in one pass (`seal` on it undoes it)."""
  out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
  if t.numel() == 0:
    return out
  _xor_stream(bytes_of(t.contiguous()), bytes_of(out), seed)
  return out


def _xor_stream(src: torch.Tensor, dst: torch.Tensor, seed: int) -> None:
  """dst = src XOR `seal`'s stream of `seed` (byte views of equal length; dst may be src)."""
  KD.xor_stream(src, dst, *KD.subkeys(seed, 0))


def count_bad_sealed(out: torch.Tensor, out_seed: int | None, ref: torch.Tensor, ref_seed: int, atol: float,
                     rtol: float) -> torch.Tensor:
  """closeness.count_bad of `out` and `ref` as they were before `seal(., seed)` (out_seed None: out is not sealed).

  Contiguous float32 tensors on CUDA are unsealed inside the comparison pass (closeness.count_bad_keyed); any other
  through unsealed temporary copies.
  """
  if (ref.device.type == "cuda" and ref.dtype == out.dtype == torch.float32 and ref.shape == out.shape
      and ref.is_contiguous() and out.is_contiguous()):
    keys = None if out_seed is None else KD.subkeys(out_seed, 0)
    return closeness.count_bad_keyed(out, keys, ref, KD.subkeys(ref_seed, 0), atol, rtol)
  plain = out if out_seed is None else sealed_copy(out, out_seed)
  return count_bad(plain, sealed_copy(ref, ref_seed), atol, rtol)


def seal_all(tensors, seed: int) -> None:
  """`seal` for each tensor with its own stream (seed + j), so no two sealed tensors share a stream."""
  for j, t in enumerate(tensors):
    seal(t, seed + j)


def _differ(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
  """Whether two same-shape tensors differ in any byte (a 0-d bool on their device): 32-bit words where both align."""
  x, y = bytes_of(a.contiguous()), bytes_of(b.contiguous())
  if x.numel() % 4 == 0 and x.storage_offset() % 4 == 0 and y.storage_offset() % 4 == 0:
    x, y = x.view(torch.int32), y.view(torch.int32)
  return (x != y).any()


def changed(pairs) -> list[bool]:
  """For every (a, b) pair: whether their shapes, dtypes or bytes differ; one synchronisation for all pairs."""
  pairs = list(pairs)
  flags = [None if a.shape != b.shape or a.dtype != b.dtype else _differ(a, b) for a, b in pairs]
  found = [f for f in flags if f is not None]
  host = iter(torch.stack(found).cpu().tolist() if found else [])
  return [True if f is None else bool(next(host)) for f in flags]


def tolerance_for(dtype: torch.dtype, atol: float, rtol: float, half_atol: float, half_rtol: float,
                  task_atol=None, task_rtol=None) -> tuple[float, float]:
  """Per-dtype tolerance: the task's override, else fp16/bf16 -> half_*, other floats -> atol/rtol."""
  if dtype in (torch.float16, torch.bfloat16):
    a, r = half_atol, half_rtol
  else:
    a, r = atol, rtol
  return (a if task_atol is None else task_atol, r if task_rtol is None else task_rtol)


def compare(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> dict | None:
  """None when `out` matches `ref`; else mismatch statistics (bad count, non-finite, max errors, first index).

  Floats: |out - ref| <= atol + rtol * |ref| elementwise (torch.isclose); NaN/Inf pass only where the reference
  has the same non-finite value. Integers and bool: exact. A match costs one pass (closeness.count_bad); the
  statistics of a mismatch are computed with torch.
  """
  if out.shape != ref.shape:
    return {"bad": out.numel(), "numel": ref.numel(), "shape_mismatch": [list(out.shape), list(ref.shape)]}
  n = ref.numel()
  if n == 0 or int(count_bad(out, ref, atol, rtol).item()) == 0:
    return None
  if ref.is_floating_point():
    wide = torch.float64 if ref.dtype == torch.float64 else torch.float32
    o, r = out.to(wide), ref.to(wide)
    ok = torch.isclose(o, r, rtol=rtol, atol=atol, equal_nan=True)
  else:
    o, r = out, ref
    ok = o == r
  bad = int((~ok).sum().item())
  if bad == 0:
    return None
  stats: dict = {"bad": bad, "numel": n}
  flat_bad = (~ok).reshape(-1)
  first = int(torch.argmax(flat_bad.to(torch.uint8)).item())  # First True (argmax returns the first maximum).
  if ref.is_floating_point():
    fin_r = torch.isfinite(r)
    fin_o = torch.isfinite(o)
    stats["nonfinite"] = int((~fin_o & fin_r).sum().item())
    both = fin_r & fin_o
    diff = torch.where(both, (o - r).abs(), torch.zeros((), dtype=wide, device=o.device))
    stats["max_abs_err"] = float(diff.max().item())
    stats["max_rel_err"] = float((diff / r.abs().clamp_min(max(atol, 1e-30))).max().item())
  idx = []
  rem = first
  for s in reversed(ref.shape):
    idx.append(rem % s)
    rem //= s
  stats["first_index"] = list(reversed(idx))
  stats["expected"] = _scalar(ref.reshape(-1)[first])
  stats["got"] = _scalar(out.reshape(-1)[first])
  return stats


def _scalar(x: torch.Tensor):
  v = x.item()
  return float(v) if isinstance(v, float) else int(v)
