"""Timing protocol (evaluator-anchors.md §4.3), identical for the reference and the candidate, with its checks.

Per iteration (warm-up iterations first, untimed):
  1. fresh inputs: an independent, unpredictable draw of the task's input distribution in the candidate's input
     buffers of set k = i mod G (G >= 2 sets, so pointers rotate too) and, the same bytes, in the reference's. A task
     whose inputs are float32/16/bf16 torch.randn / torch.rand tensors (inputs.redraw_plan, checked at load;
     `details.timing.redraw` names the factories) gets N(0, 1) / U[0, 1) from keyed_draw.py's generator with a fresh
     secret 64-bit key, written into both in one pass (into one reusable reference set; with CUDA graphs, set k's):
     the task's distribution, not torch's bytes. Any other task gets get_inputs() reseeded with a secret seed,
     copied into the candidate's set, the draw itself going to the reference. `details.timing.fresh_draw` says
     which ('keyed' | 'get_inputs'). No launch ever sees contents it, or anything derived from them, saw before,
     so a result memoised per pointer or content (and rescaled) or work batched ahead for later calls is wrong. A
     task whose get_inputs() draw is too slow for every run (worker.FRESH_DRAW_MS) falls back to G drawn sets,
     each multiplied by a fresh secret factor in [0.8, 1]; `details.timing.inputs` says which;
  2. candidate outputs and scratch are poisoned (NaN);
  3. L2 flush (a >= 2 x L2 write), CUDA events around the candidate's launches;
  4. L2 flush, CUDA events around the reference forward (skipped in 'cached' reference mode unless validating);
  5. on a secret random subset of iterations (always the first and the last timed one, the first warm-up one,
     and all of them when re-checking an excessive speedup): the candidate's outputs are compared on the GPU with
     the reference outputs of the same inputs, computed after the candidate finished (scrubbed afterwards with
     rescaled inputs only, validated or not: a fresh draw shares nothing with the next run's inputs), and keyed
     hashes (integrity.py) of the candidate's input and parameter buffers taken before its launches must equal
     those taken after them, and so must the hashes of the reference's own input tensors taken after them (they
     hold the same bytes; a kernel that rewrote the reference's inputs in GPU memory, e.g. to zeros, and wrote the
     output of those, would otherwise pass the comparison);
  6. a polled wait with a deadline (a hang becomes a timeout; the evaluation's budget applies too) for the
     iteration before: the host queues iteration i+1 while the GPU runs iteration i, so host-side preparation
     (draw calls, launches, events) overlaps the GPU. Everything still runs in order on the worker's one stream:
     nothing runs beside the candidate's or the reference's timed launches.
Each pass starts with fresh guard canaries and ends with a guard check and a byte comparison of the parameter
buffers, so a timed run that writes out of bounds or mutates inputs is caught even if it restores what it changed
before a validated iteration's check.
N is `timing_runs`, or fewer under a time budget (`timing_max_s` > 0): once the timed iterations have taken
timing_max_s of wall time and at least `timing_min_runs` are done, the next iteration is the last, and it is
validated like every pass's last iteration. Statistic: median of N per side; speedup = median_ref /
median_candidate. Launch-bound tasks (reference below `graph_threshold_ms`) can be timed as CUDA-graph replays on
both sides (`timing_graphs`).
"""

from __future__ import annotations

import statistics
import time

import torch

from kevin_jax.kernels import buffers as B
from kevin_jax.kernels import inputs as I
from kevin_jax.kernels import keyed_draw as KD
from kevin_jax.kernels.closeness import count_bad


def _stats(ms: list[float]) -> dict:
  if not ms:
    return {}
  s = sorted(ms)
  q = lambda f: s[min(len(s) - 1, int(f * (len(s) - 1) + 0.5))]
  return {"median": statistics.median(s), "mean": statistics.fmean(s), "min": s[0], "p10": q(0.1), "p90": q(0.9),
          "n": len(s)}


def _scrub(outs, param_ptrs) -> None:
  for o in outs:
    if o.untyped_storage().data_ptr() not in param_ptrs and o.is_contiguous():
      B.bytes_of(o).fill_(0)


class _Setup:
  """Input buffer sets, input draws, integrity keys and (optionally) CUDA graphs for one timing measurement."""

  def __init__(self, w, state, bound, mod, bufs):
    s, info = w.s, state.info
    self.w, self.state, self.bound, self.mod, self.bufs = w, state, bound, mod, bufs
    self.n_sets = max(2, int(s["timing_input_sets"]))
    self.fresh = bool(state.fresh_inputs)
    self.redraw = state.redraw if self.fresh else None
    self.names = [n for n, i in zip(info.input_names, info.inputs) if i["kind"] == "tensor"]
    self.ptrs, self.cand_in = [], []
    for k in range(self.n_sets):
      ptrs = bufs.pointers()
      row = []
      for name in self.names:
        g = bufs[name] if k == 0 else bufs.alloc(f"{name}#{k}", bufs[name].tensor.shape, bufs[name].tensor.dtype)
        ptrs[name] = g.ptr
        row.append(g.tensor)
      self.ptrs.append(ptrs)
      self.cand_in.append(row)
    self.base = None if self.fresh else [self.draw() for _ in range(self.n_sets)]
    self.ref_in = None if self.fresh else [[_clone(x) for x in base] for base in self.base]
    # Keyed draws: the reference's one reusable set (new contiguous tensors of a draw's shapes, written every run;
    # the draw's scalars kept).
    self.ref_keyed = None if self.redraw is None else [
        torch.empty(x.shape, dtype=x.dtype, device=x.device) if isinstance(x, torch.Tensor) else x
        for x in self.draw()]
    self.outs = [f"out{j}" for j in range(len(info.outputs))]
    self.fill = self.outs + [name for name, _, _, zero in bound.scratch if not zero]
    self.zeros = [name for name, _, _, zero in bound.scratch if zero]
    self.tols = [B.tolerance_for(B.DTYPES[o["dtype"]], s["atol"], s["rtol"], s["half_atol"], s["half_rtol"],
                                 info.options.get("atol"), info.options.get("rtol")) for o in info.outputs]
    self.param_ptrs = {p.untyped_storage().data_ptr() for p in state.params.values()}
    self.key = w.secret.getrandbits(64)
    self.params = [bufs[n].tensor for n in bufs.param_snapshot]
    self.param_hash = w.hasher(self.params, self.key) if self.params else None
    self.cand_graphs = self.ref_graphs = None

  def draw(self) -> list:
    """The task's get_inputs() with a secret seed."""
    return I.draw(self.state.module, "task", self.w.secret.getrandbits(62), self.w.device)

  def set_inputs(self, k: int) -> list:
    """New contents for the candidate's input set k; returns the reference's arguments (module docstring, 1.)."""
    if self.redraw is not None:
      ref = self.ref_in[k] if self.ref_graphs is not None else self.ref_keyed
      KD.write(self.redraw, self.w.secret.getrandbits(64),
               zip(self.cand_in[k], [x for x in ref if isinstance(x, torch.Tensor)]))
      return ref
    if self.fresh:
      args = self.draw()
      tensors = [x for x in args if isinstance(x, torch.Tensor)]
      for c, x in zip(self.cand_in[k], tensors):
        c.copy_(x)
      if self.ref_graphs is None:
        return args
      for r, x in zip([x for x in self.ref_in[k] if isinstance(x, torch.Tensor)], tensors):
        r.copy_(x)
      return self.ref_in[k]
    ref_tensors = [x for x in self.ref_in[k] if isinstance(x, torch.Tensor)]
    base_tensors = [x for x in self.base[k] if isinstance(x, torch.Tensor)]
    for b, c, r in zip(base_tensors, self.cand_in[k], ref_tensors):
      if b.is_floating_point():
        f = self.w.secret.uniform(0.8, 1.0)
        torch.mul(b, f, out=c)
        torch.mul(b, f, out=r)
      else:
        c.copy_(b)
        r.copy_(b)
    return self.ref_in[k]

  def integrity(self, k: int, ref_args: list | None = None) -> torch.Tensor:
    """Keyed hashes of the candidate's input set k and its parameter buffers (one device tensor).

    With `ref_args` (after the candidate), also the reference's tensor arguments, hashed against the candidate's
    inputs: `expected` gives the hashes they must have (equal bytes, module docstring 5.).
    """
    ref = [x for x in ref_args if isinstance(x, torch.Tensor)] if ref_args is not None else []
    return self.w.hasher(self.cand_in[k] + self.params + ref, self.key)

  def expected(self, before: torch.Tensor) -> torch.Tensor:
    """The after-candidate hashes `integrity(k, ref_args)` must equal, given `integrity(k)` before the launches."""
    return torch.cat([before, before[:len(self.names)]])

  def run_candidate(self, k: int, stream_ptr: int) -> None:
    if self.cand_graphs is not None:
      self.cand_graphs[k].replay()
    else:
      self.mod.run(self.bound, self.ptrs[k], stream_ptr)

  def run_reference(self, k: int, args: list):
    if self.ref_graphs is not None:
      g, outs = self.ref_graphs[k]
      g.replay()
      return outs
    with torch.no_grad():
      out = self.state.model(*args)
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)

  def capture(self) -> None:
    """CUDA graphs of both sides per input set (raises if either cannot be captured)."""
    if self.ref_in is None:
      self.ref_in = [[_clone(x) for x in self.draw()] for _ in range(self.n_sets)]
    torch.cuda.synchronize()
    cand, ref = [], []
    for k in range(self.n_sets):
      g = torch.cuda.CUDAGraph()
      with torch.cuda.graph(g):
        self.mod.run(self.bound, self.ptrs[k], torch.cuda.current_stream().cuda_stream)
      cand.append(g)
      g = torch.cuda.CUDAGraph()
      with torch.no_grad(), torch.cuda.graph(g):
        out = self.state.model(*self.ref_in[k])
      ref.append((g, tuple(out) if isinstance(out, (tuple, list)) else (out,)))
    torch.cuda.synchronize()
    self.cand_graphs, self.ref_graphs = cand, ref


def _clone(x):
  return x.clone() if isinstance(x, torch.Tensor) else x


def _pass(su: _Setup, n_runs: int, warmup: int, validate_all: bool, time_ref: bool, deadline_s: float) -> dict:
  w, stream, clock = su.w, su.w.stream, su.w.clock
  total = warmup + n_runs
  frac = float(w.s["validate_fraction"])
  max_s, min_runs = float(w.s["timing_max_s"]), int(w.s["timing_min_runs"])
  validate = [validate_all or i in (0, warmup, total - 1) or (i >= warmup and w.secret.random() < frac)
              for i in range(total)]
  cand_ev, ref_ev, checks, integrity = [], [], [], []
  su.bufs.rearm()
  timed_since = None
  in_flight = None  # (label, completion event) of the iteration queued before this one (module docstring, 6.)
  for i in range(total):
    if i == warmup:
      timed_since = time.monotonic()
    # Under a time budget this iteration is the last once enough timed ones took long enough (module docstring).
    last = i == total - 1 or (max_s > 0 and timed_since is not None and i - warmup + 1 >= min_runs
                              and time.monotonic() - timed_since >= max_s)
    validate[i] = validate[i] or last
    k = i % su.n_sets
    with clock("timing/draw"):
      ref_args = su.set_inputs(k)
    if validate[i]:
      with clock("timing/integrity"):
        before = su.integrity(k)
    with clock("timing/fill"):
      su.bufs.fill(su.fill, B.POISON_NAN)
      su.bufs.fill(su.zeros, 0)
    c0, c1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with clock("timing/flush"):
      w.flush.zero_()
    with clock("timing/candidate"):
      c0.record(stream)
      su.run_candidate(k, stream.cuda_stream)
      c1.record(stream)
    if validate[i]:
      with clock("timing/integrity"):
        integrity.append((i, (su.integrity(k, ref_args) != su.expected(before)).sum()))
    if time_ref or validate[i]:
      r0, r1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
      with clock("timing/flush"):
        w.flush.zero_()
      with clock("timing/reference"):
        r0.record(stream)
        ref_out = su.run_reference(k, ref_args)
        r1.record(stream)
      with clock("timing/validate"):
        if validate[i]:
          bad = [count_bad(su.bufs[o].tensor, r, *tol) for o, r, tol in zip(su.outs, ref_out, su.tols)]
          checks.append((i, torch.stack(bad).sum()))
        if not su.fresh:  # A fresh draw shares nothing with the next run's inputs (module docstring, 5.).
          _scrub(ref_out, su.param_ptrs)
      del ref_out
      if i >= warmup and time_ref:
        ref_ev.append((r0, r1))
    del ref_args
    done = torch.cuda.Event()
    done.record(stream)
    if in_flight is not None:
      with clock("timing/wait"):
        w.wait_for(in_flight[0], deadline_s, in_flight[1])
    in_flight = (f"timed run {i + 1}", done)
    if i >= warmup:
      cand_ev.append((c0, c1))
    if last:
      break
  with clock("timing/wait"):
    w.wait_for(in_flight[0], deadline_s, in_flight[1])
  with clock("timing/events"):
    out = {"cand_ms": [a.elapsed_time(b) for a, b in cand_ev], "ref_ms": [a.elapsed_time(b) for a, b in ref_ev],
           "validated": len(checks), "bad_run": None, "mutated_run": None, "budget_stop": len(cand_ev) < n_runs,
           "guard": None}
  with clock("timing/pass_checks"):
    out["guard"] = next(iter(su.bufs.guard_violations()), None)
    snap = su.bufs.param_snapshot
    if any(B.changed((su.bufs[n].tensor, p) for n, p in snap.items())):
      out["mutated_run"] = "a timed run"
    for name, found in (("bad_run", checks), ("mutated_run", integrity)):
      if found and out[name] is None:
        counts = torch.stack([c for _, c in found]).cpu().tolist()
        for (i, _), n in zip(found, counts):
          if n:
            out[name] = f"timed run {i + 1}"
            out["bad_count"] = int(n)
            break
  return out


def _per_launch_ms(su: _Setup, deadline_s: float) -> list:
  """One extra flushed run with events between launches (feedback on where the time goes)."""
  stream = su.w.stream
  su.set_inputs(0)
  su.bufs.fill(su.fill, B.POISON_NAN)
  su.bufs.fill(su.zeros, 0)
  su.w.flush.zero_()
  evs = [torch.cuda.Event(enable_timing=True) for _ in range(len(su.bound.launches) + 1)]
  evs[0].record(stream)
  for k, bl in enumerate(su.bound.launches):
    su.mod.launch(bl, su.ptrs[0], stream.cuda_stream)
    evs[k + 1].record(stream)
  su.w.wait_for("per-launch timing run", deadline_s)
  return [(bl.kernel, evs[k].elapsed_time(evs[k + 1])) for k, bl in enumerate(su.bound.launches)]


def measure(w, state, bound, mod, bufs, deadline_s: float, job: dict, res: dict) -> None:
  """Times candidate vs reference; sets res status/speedup/timings (or incorrect if a timed output is wrong)."""
  s, clock = w.s, w.clock
  with clock("timing/setup"):
    su = _Setup(w, state, bound, mod, bufs)
  cached_ref = job.get("ref_time_ms")
  time_ref = cached_ref is None
  mode = s["timing_graphs"]
  method = "events"
  if mode == "always" or (mode == "auto" and state.ref_ms_rough < float(s["graph_threshold_ms"])):
    try:
      with clock("timing/capture"):
        su.capture()
      method = "cuda_graphs"
      res["flags"].append("cuda_graphs")
    except Exception as e:  # pylint: disable=broad-except
      su.cand_graphs = su.ref_graphs = None
      res["details"]["graph_capture_error"] = f"{type(e).__name__}: {str(e)[:300]}"
      torch.cuda.synchronize()  # Raises (-> fatal) if the failed capture broke the context.
  with clock("timing/pass"):
    p = _pass(su, int(s["timing_runs"]), int(s["warmup_runs"]), False, time_ref, deadline_s)
  info = {"method": method, "input_sets": su.n_sets, "inputs": "fresh" if su.fresh else "rescaled",
          "redraw": list(su.redraw) if su.redraw is not None else None,
          "fresh_draw": ("keyed" if su.redraw is not None else "get_inputs") if su.fresh else None,
          "draw_ms": round(float(state.draw_ms), 3),
          "flush_bytes": w.flush.numel(), "validated": p["validated"], "budget_stop": p["budget_stop"]}

  def conclude(p, recheck: bool) -> bool:
    cand, ref = _stats(p["cand_ms"]), _stats(p["ref_ms"])
    ref_median = ref["median"] if ref else float(cached_ref)
    info.update(cand_ms=cand, ref_ms=ref or {"median": ref_median, "cached": True})
    res["cand_time_ms"], res["ref_time_ms"] = cand["median"], ref_median
    res["speedup"] = ref_median / cand["median"] if cand["median"] > 0 else float("inf")
    if p["guard"] is not None:
      name, side, nbytes = p["guard"]
      shown = "out" if name == "out0" and len(su.outs) == 1 else name.split("#")[0]
      res["flags"].append("out_of_bounds_write")
      res["status"], res["speedup"] = "runtime_error", None
      res["error"] = (f"a timed run wrote outside buffer '{shown}' ({nbytes} guard bytes "
                      f"{'before its start' if side == 'before' else 'after its end'} changed)")
      return False
    if p["mutated_run"] is not None:
      res["flags"].append("input_mutation")
      res["status"], res["speedup"] = "runtime_error", None
      res["error"] = (f"the kernels modified an input or parameter during {p['mutated_run']}; inputs and parameters "
                      f"are read-only (use a scratch buffer)")
      return False
    if p["bad_run"] is not None:
      res["flags"].append("timing_validation_failed")
      res["status"] = "incorrect"
      res["error"] = (f"the output of {p['bad_run']} was wrong ({p['bad_count']:,} elements) although the "
                      f"correctness trials passed: results must not depend on earlier launches or call counts"
                      + (" (re-check of an excessive speedup)" if recheck else ""))
      res["speedup"] = None
      return False
    return True

  ok = conclude(p, False)
  if ok and res["speedup"] > float(s["excessive_speedup"]):
    res["flags"].append("excessive_speedup")
    info["first_pass"] = {"cand_ms": info["cand_ms"], "ref_ms": info["ref_ms"]}
    with clock("timing/pass"):
      p = _pass(su, int(s["timing_runs"]), int(s["warmup_runs"]), True, time_ref, deadline_s)
    info["validated"], info["budget_stop"] = p["validated"], p["budget_stop"]
    ok = conclude(p, True)
  if ok:
    res["status"] = "correct"
    if len(bound.launches) > 1:  # Eager launches, also when the timing used graphs.
      with clock("timing/per_launch"):
        res["details"]["kernel_ms"] = _per_launch_ms(su, deadline_s)
  res["details"]["timing"] = info
