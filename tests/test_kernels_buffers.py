"""Guard bands, poison, sealing, comparison and input draws, exercised on CPU tensors (buffers.py, inputs.py).

The GPU worker runs the same code on CUDA tensors; these tests pin down its logic without a GPU.
"""

import os

import pytest
import torch

from kevin_jax.kernels import buffers as B
from kevin_jax.kernels import inputs as I
from kevin_jax.kernels import keyed_draw as KD
from kevin_jax.kernels import tasks
from kevin_jax.kernels.integrity import KeyedHash

CPU = torch.device("cpu")
TASKS = os.path.join(os.path.dirname(__file__), "data", "eval", "tasks")


def bufset(seed=0):
  g = torch.Generator(device=CPU)
  g.manual_seed(seed)
  return B.BufferSet(CPU, g)


def test_guard_bands_catch_writes_just_outside():
  bs = bufset()
  a = bs.alloc("a", (3, 5), torch.float32)
  bs.alloc("b", (7,), torch.float16)
  assert a.tensor.shape == (3, 5) and a.nbytes == 60 and a.ptr == a.tensor.data_ptr()
  assert a.tensor.data_ptr() % 256 == a.raw.data_ptr() % 256  # Data starts GUARD_BYTES (a multiple of 256) in.
  assert bs.guard_violations() == []
  a.tensor.fill_(1.0)  # In-bounds writes are fine.
  assert bs.guard_violations() == []
  a.raw[B.GUARD_BYTES + 60:B.GUARD_BYTES + 68].fill_(0x11)  # Two floats past the end.
  a.raw[B.GUARD_BYTES - 4] ^= 0xFF  # One byte before the start.
  assert bs.guard_violations() == [("a", "before", 1), ("a", "after", 8)]


def test_poison_values_and_unwritten_count():
  bs = bufset()
  f = bs.alloc("f", (10,), torch.float32)
  h = bs.alloc("h", (10,), torch.float16)
  i = bs.alloc("i", (10,), torch.int64)
  bs.fill(["f", "h", "i"], B.POISON_NAN)
  assert torch.isnan(f.tensor).all() and torch.isnan(h.tensor).all() and (i.tensor == -1).all()
  bs.fill(["f", "h"], B.POISON_FINITE)
  assert torch.isfinite(f.tensor).all() and torch.isfinite(h.tensor).all()
  assert f.tensor[0].item() == pytest.approx(1.5365e16, rel=1e-3) and h.tensor[0].item() == 203.25
  f.tensor[:7] = 1.0
  assert B.poison_value_count(f.tensor, B.POISON_FINITE) == 3
  assert B.poison_value_count(h.tensor, B.POISON_FINITE) == 10
  assert bs.guard_violations() == []


def test_seal_is_an_involution_and_hides_the_data():
  x = torch.arange(1000, dtype=torch.float32)
  y = x.clone()
  B.seal(y, 1234)
  assert not torch.equal(x, y)
  assert (B.bytes_of(y) == B.bytes_of(x)).float().mean() < 0.05
  B.seal(y, 1234)
  assert torch.equal(x, y)


def _recording_streams(monkeypatch) -> list:
  made, real = [], KD.stream_bytes
  monkeypatch.setattr(KD, "stream_bytes", lambda *a: made.append(real(*a)) or made[-1])
  return made


@pytest.mark.parametrize("dtype,n", [(torch.float32, 1000), (torch.float16, 1001), (torch.uint8, 7)])
def test_seal_leaves_no_copy_of_its_stream(monkeypatch, dtype, n):
  """The stream seal draws on the CPU is zero-filled once used: freed memory never holds the key to a sealed copy
  (on CUDA no copy of it exists: keyed_draw.xor_stream)."""
  made = _recording_streams(monkeypatch)
  x = (torch.arange(n) % 251).to(dtype)
  y = x.clone()
  B.seal(y, 99)
  monkeypatch.undo()
  assert len(made) == 1 and made[0].numel() == n * x.element_size() and int(made[0].count_nonzero()) == 0
  assert (B.bytes_of(y) != B.bytes_of(x)).float().mean() > 0.9
  B.seal(y, 99)
  assert torch.equal(B.bytes_of(y), B.bytes_of(x))


def test_the_seal_stream_is_the_keyed_hash():
  """Byte k of the stream of a seed is byte k mod 8 of h(k div 8) (keyed_draw.py); every position has its own."""
  x = torch.zeros(1030, dtype=torch.uint8)
  B.seal(x, 5)
  words = KD.hashes(0, 129, *KD.subkeys(5, 0))
  assert x.tolist() == [(int(words[k // 8]) >> (8 * (k % 8))) & 0xFF for k in range(1030)]
  pad = torch.zeros(4000, dtype=torch.uint8)
  B.seal(pad, 6)
  assert (pad[:1000] == pad[1000:2000]).float().mean() < 0.05 and (pad[:1000] == x[:1000]).float().mean() < 0.05


@pytest.mark.parametrize("dtype,n,offset", [(torch.float32, 1030, 0), (torch.float16, 1001, 0),
                                            (torch.uint8, 7, 0), (torch.uint8, 403, 1)])
def test_sealed_copy_is_clone_then_seal_and_leaves_no_stream(monkeypatch, dtype, n, offset):
  """sealed_copy (one pass) holds the same bytes as a clone sealed in place, with a byte tail, also from a source at
  an odd byte offset; `seal` undoes it; its stream ends zero-filled; the source is untouched."""
  base = (torch.arange(n + offset) * 37 % 251).to(dtype)
  x = base[offset:]
  expect = x.clone()
  B.seal(expect, 11)
  made = _recording_streams(monkeypatch)
  y = B.sealed_copy(x, 11)
  monkeypatch.undo()
  assert torch.equal(B.bytes_of(y), B.bytes_of(expect)) and y.is_contiguous()
  assert made and all(int(t.count_nonzero()) == 0 for t in made)
  assert torch.equal(x, (torch.arange(n + offset) * 37 % 251).to(dtype)[offset:])
  B.seal(y, 11)
  assert torch.equal(B.bytes_of(y), B.bytes_of(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_count_bad_sealed_is_count_bad_of_the_unsealed_tensors(dtype):
  """The same count as count_bad on the tensors before sealing: one sealed side or both, matches and mismatches
  (NaN, a value just outside the tolerance); neither tensor changes."""
  gen = torch.Generator().manual_seed(3)
  ref = torch.randn(1001, generator=gen).to(dtype)
  out = ref.clone()
  out[::97] += 1.0
  out[5] = float("nan")
  for a in (ref, out):
    sa, sr = a.clone(), ref.clone()
    B.seal(sa, 21)
    B.seal(sr, 22)
    kept = (sa.clone(), sr.clone())
    want = int(B.count_bad(a, ref, 1e-3, 1e-3))
    assert int(B.count_bad_sealed(sa, 21, sr, 22, 1e-3, 1e-3)) == want
    assert int(B.count_bad_sealed(a, None, sr, 22, 1e-3, 1e-3)) == want
    assert int(B.count_bad_sealed(sa, 23, sr, 22, 1e-3, 1e-3)) > 0  # The wrong seed unseals to noise.
    assert torch.equal(B.bytes_of(sa), B.bytes_of(kept[0])) and torch.equal(B.bytes_of(sr), B.bytes_of(kept[1]))
  assert int(B.count_bad_sealed(ref, None, ref.clone(), 22, 1e-3, 1e-3)) > 0  # An unsealed ref is not the ref.


def test_changed_is_a_byte_comparison_per_pair():
  """One flag per pair: any changed byte (also a NaN payload or -0.0 vs 0.0, which compare equal as floats), a shape
  or dtype difference; equal bytes (NaNs included) are unchanged; odd byte counts compare as bytes."""
  x = torch.tensor([1.0, float("nan"), 0.0, 3.0])
  same = x.clone()
  neg_zero = x.clone()
  neg_zero[2] = -0.0
  payload = x.clone()
  B.bytes_of(payload)[4] ^= 1  # Another NaN.
  odd = torch.arange(7, dtype=torch.uint8)
  odd2 = odd.clone()
  odd2[6] = 9
  flags = B.changed([(x, same), (x, neg_zero), (x, payload), (x, x[:3]), (x, x.double()), (odd, odd.clone()),
                     (odd, odd2), (torch.empty(0), torch.empty(0))])
  assert flags == [False, True, True, True, True, False, True, False]
  assert B.changed([]) == []


def test_seal_all_gives_every_tensor_its_own_stream():
  """Two outputs sealed with one stream would leak a ^ b (a known output unseals the other); seal_all does not."""
  a, b = torch.randn(4096), torch.randn(4096)
  sa, sb = a.clone(), b.clone()
  B.seal_all([sa, sb], 7)
  leaked = B.bytes_of(sa) ^ B.bytes_of(sb)
  assert (leaked == (B.bytes_of(a) ^ B.bytes_of(b))).float().mean() < 0.05
  B.seal_all([sa, sb], 7)
  assert torch.equal(sa, a) and torch.equal(sb, b)


def test_compare_floats():
  ref = torch.tensor([1.0, -2.0, 100.0, 0.0, float("nan")])
  assert B.compare(ref.clone(), ref, 1e-4, 1e-4) is None  # NaN where the reference is NaN passes.
  out = ref.clone()
  out[2] = 100.0 + 0.0102  # Tolerance here is atol + rtol * 100 = 0.0101.
  out[3] = 5e-5  # Inside atol.
  m = B.compare(out, ref, 1e-4, 1e-4)
  assert m["bad"] == 1 and m["first_index"] == [2] and m["expected"] == 100.0
  assert m["max_abs_err"] == pytest.approx(0.0102, rel=1e-3) and m["nonfinite"] == 0
  out = ref.clone()
  out[1] = float("nan")
  out[0] = float("inf")
  m = B.compare(out.reshape(5, 1), ref.reshape(5, 1), 1e-4, 1e-4)
  assert m["bad"] == 2 and m["nonfinite"] == 2 and m["first_index"] == [0, 0] and m["got"] == float("inf")


def test_compare_integers_shapes_and_half():
  ref = torch.tensor([[1, 2], [3, 4]])
  assert B.compare(ref.clone(), ref, 1e-4, 1e-4) is None
  out = ref.clone()
  out[1, 0] = 7
  m = B.compare(out, ref, 1.0, 1.0)  # Integers are exact whatever the tolerance.
  assert m["bad"] == 1 and m["first_index"] == [1, 0] and m["got"] == 7 and m["expected"] == 3
  assert B.compare(torch.zeros(3), torch.zeros(4), 1, 1)["shape_mismatch"] == [[3], [4]]
  r = torch.tensor([1.0, 2.0], dtype=torch.float16)
  assert B.compare(r + 0.005, r, *B.tolerance_for(r.dtype, 1e-4, 1e-4, 1e-2, 1e-2)) is None


def test_tolerance_per_dtype_and_task_override():
  assert B.tolerance_for(torch.float32, 1e-4, 2e-4, 1e-2, 3e-2) == (1e-4, 2e-4)
  assert B.tolerance_for(torch.bfloat16, 1e-4, 2e-4, 1e-2, 3e-2) == (1e-2, 3e-2)
  assert B.tolerance_for(torch.float32, 1e-4, 2e-4, 1e-2, 3e-2, task_atol=1e-3) == (1e-3, 2e-4)


def test_keyed_hash_detects_changes_that_keep_sums():
  """A changed word, a swap of two elements (same sum, same sum of squares) and an odd byte count are all seen;
  another key gives other hashes."""
  h = KeyedHash(torch.device("cpu"))
  w = [torch.randn(100), torch.randn(3, 3, dtype=torch.float16), torch.arange(7, dtype=torch.uint8)]
  before = h(w, key=12345)
  assert torch.equal(h(w, key=12345), before) and not torch.equal(h(w, key=54321), before)
  swapped = [w[0][[1, 0] + list(range(2, 100))], w[1], w[2]]
  assert h(swapped, key=12345)[0] != before[0] and h(swapped, key=12345)[1:].tolist() == before[1:].tolist()
  w[0][17] += 1e-3
  w[2][6] += 1
  after = h(w, key=12345)
  assert after[0] != before[0] and after[2] != before[2] and after[1] == before[1]


def _module(task):
  return tasks.load_module(tasks.TaskSpec(id=task, path=os.path.join(TASKS, task + ".py"), level=0))


def test_draws_are_seeded_and_have_the_named_distributions():
  mod = _module("row_sum")
  a, b = I.draw(mod, "task", 7, CPU)[0], I.draw(mod, "task", 7, CPU)[0]
  assert torch.equal(a, b) and a.shape == (4096, 2048)
  assert not torch.equal(a, I.draw(mod, "task", 8, CPU)[0])
  u = I.draw(mod, "uniform", 7, CPU)[0]
  assert u.min() >= -1 and u.max() <= 1 and abs(u.mean()) < 0.01
  s = I.draw(mod, "shifted", 7, CPU)[0]
  assert s.mean().item() == pytest.approx(1.0, abs=0.01) and s.std().item() == pytest.approx(2.0, abs=0.01)
  h = I.draw(mod, "heavy", 7, CPU)[0]
  assert h.std().item() == pytest.approx(2 ** 0.5, abs=0.02)  # Laplace(0, 1).
  assert (h.abs() > 8).float().mean() > 1e-4  # Heavier tails than a normal.


@pytest.mark.parametrize("dist", ["normal", "uniform", "heavy", "shifted"])
def test_distributions_are_the_textbook_formulas_on_the_same_stream(dist):
  """Each one-pass draw gives, bit for bit, its formula written as separate elementwise steps."""
  x = torch.randn(3, 50_000)
  gen, ref = torch.Generator(device=CPU), torch.Generator(device=CPU)
  gen.manual_seed(99)
  ref.manual_seed(99)
  if dist == "normal":
    want = torch.randn(x.shape, generator=ref)
  elif dist == "uniform":
    want = torch.rand(x.shape, generator=ref) * 2 - 1
  elif dist == "heavy":
    u = torch.rand(x.shape, generator=ref) - 0.5
    want = -torch.sign(u) * torch.log1p(-2 * u.abs()).clamp_min(-80.0)
  else:
    want = torch.randn(x.shape, generator=ref) * 2 + 1
  assert torch.equal(I._transform(x, dist, gen), want)


def test_integer_inputs_and_structured_inputs_are_preserved(tmp_path):
  emb = _module("embedding")
  idx_task, idx_normal = I.draw(emb, "task", 3, CPU)[0], I.draw(emb, "normal", 3, CPU)[0]
  assert idx_task.dtype == torch.int64 and torch.equal(idx_task, idx_normal)
  f = tmp_path / "tril.py"
  f.write_text("import torch\nclass Model(torch.nn.Module):\n  def forward(self, a):\n    return a\n"
               "def get_inputs():\n  return [torch.tril(torch.randn(64, 64))]\n"
               "def get_init_inputs():\n  return []\n")
  mod = tasks.load_module(tasks.TaskSpec(id="tril", path=str(f), level=0))
  x = I.draw(mod, "normal", 5, CPU)[0]
  assert torch.equal(x, torch.tril(x)) and (x != 0).sum() == 64 * 65 // 2  # Zeros kept, values changed.
  assert not torch.equal(x, I.draw(mod, "task", 5, CPU)[0])


def _source_module(tmp_path, name, inputs):
  f = tmp_path / f"{name}.py"
  f.write_text("import torch\nclass Model(torch.nn.Module):\n  def forward(self, *a):\n    return a[0]\n"
               f"def get_inputs():\n  return {inputs}\n"
               "def get_init_inputs():\n  return []\n")
  return tasks.load_module(tasks.TaskSpec(id=name, path=str(f), level=0))


@pytest.mark.parametrize("inputs, plan", [
    ("[torch.randn(64, 33)]", ("randn",)),
    ("[torch.rand(16, 8), torch.randn(8, 5), 3]", ("rand", "randn")),
    ("[torch.randn(40, dtype=torch.float16)]", ("randn",)),
    ("[torch.rand(40, dtype=torch.bfloat16)]", ("rand",)),
    ("[torch.randn(40, dtype=torch.float64)]", None),  # No keyed draw of float64.
    ("[torch.randn(100) * 2]", None),  # Not the factory's bytes.
    ("[torch.randn(100).half()]", None),  # Drawn in fp32, then rounded.
    ("[torch.randn(100), torch.randint(0, 5, (10,))]", None),
    ("[torch.ones(100)]", None),
    ("[torch.randn(1)[:0], torch.randn(100)]", None)])  # The generator moved between the returned tensors.
def test_redraw_plan_writes_the_task_draw_in_place_bit_for_bit(tmp_path, inputs, plan):
  mod = _source_module(tmp_path, "t", inputs)
  assert I.redraw_plan(mod, CPU) == plan
  if plan is None:
    return
  want = [x for x in I.draw(mod, "task", 12345, CPU) if isinstance(x, torch.Tensor)]
  outs = [torch.full_like(x, float("nan")) for x in want]
  I.redraw(plan, 12345, outs)
  assert all(torch.equal(B.bytes_of(a), B.bytes_of(b)) for a, b in zip(outs, want))
  I.redraw(plan, 12346, outs)
  assert not torch.equal(outs[0], want[0])


def test_trial_distributions():
  assert I.trial_distributions(5, ("task", "normal", "uniform"), None) == ["task", "normal", "uniform", "task",
                                                                          "normal"]
  assert I.trial_distributions(3, ("normal",), None) == ["task", "normal", "task"]
  assert I.trial_distributions(3, ("task", "normal"), ("task",)) == ["task"] * 3
  assert I.trial_distributions(4, ("task", "normal", "heavy"), None, unsafe=("normal",)) == ["task", "heavy",
                                                                                             "task", "heavy"]


@pytest.mark.gpu
def test_sealed_copy_and_changed_on_the_gpu():
  """On CUDA tensors (words and a byte tail, and from an odd byte offset): the seal is the CPU's stream byte for
  byte, sealed_copy == clone + seal, seal undoes it, and changed() sees one flipped byte in 2^22 words."""
  if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU")
  x = torch.randn(2**22 + 3, device="cuda").to(torch.float16)  # 8 MiB + 6 bytes: words and a 6-byte tail.
  expect = x.clone()
  B.seal(expect, 77)
  on_cpu = x.cpu()
  B.seal(on_cpu, 77)
  assert torch.equal(B.bytes_of(expect.cpu()), B.bytes_of(on_cpu))
  y = B.sealed_copy(x, 77)
  assert torch.equal(B.bytes_of(y), B.bytes_of(expect))
  B.seal(y, 77)
  assert torch.equal(B.bytes_of(y), B.bytes_of(x))
  odd = B.bytes_of(x)[3:3 + 1001]  # Not 8-byte aligned: the kernel's byte path, the same stream.
  sealed = B.sealed_copy(odd, 8)
  want = odd.cpu().clone()
  B.seal(want, 8)
  assert torch.equal(sealed.cpu(), want)
  z = x.clone()
  B.bytes_of(z)[12345] ^= 0x01
  assert B.changed([(x, x.clone()), (x, z)]) == [False, True]


@pytest.mark.gpu
def test_count_bad_sealed_on_the_gpu_unseals_inside_the_comparison():
  """The fused float32 comparison of sealed tensors counts what count_bad counts on the unsealed ones (one side
  sealed or both, odd length, over one grid stride), and leaves both sealed."""
  if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU")
  gen = torch.Generator(device="cuda").manual_seed(3)
  ref = torch.randn(2**22 + 2**21 + 1, device="cuda", generator=gen)
  out = ref.clone()
  out[::9973] += 1.0
  out[-1] = float("nan")
  for a in (ref, out):
    sa, sr = B.sealed_copy(a, 31), B.sealed_copy(ref, 32)
    kept = (sa.clone(), sr.clone())
    want = int(B.count_bad(a, ref, 1e-4, 1e-4))
    assert int(B.count_bad_sealed(sa, 31, sr, 32, 1e-4, 1e-4)) == want
    assert int(B.count_bad_sealed(a, None, sr, 32, 1e-4, 1e-4)) == want
    assert torch.equal(B.bytes_of(sa), B.bytes_of(kept[0])) and torch.equal(B.bytes_of(sr), B.bytes_of(kept[1]))
  assert int(B.count_bad_sealed(ref, None, B.sealed_copy(ref, 32), 33, 1e-4, 1e-4)) > 0


@pytest.mark.gpu
@pytest.mark.parametrize("task, plan", [("relu_1ms", ("randn",)), ("matmul_1ms", ("randn", "randn"))])
def test_redraw_on_the_gpu_is_the_task_draw(task, plan):
  """The bench tasks have a redraw plan on CUDA (their timed inputs are keyed draws): the factories give the task
  draw bit for bit, also into a view of a guarded buffer."""
  if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU")
  mod, dev = _module(task), torch.device("cuda")
  assert I.redraw_plan(mod, dev) == plan
  want = [x for x in I.draw(mod, "task", 2024, dev) if isinstance(x, torch.Tensor)]
  g = torch.Generator(device=dev)
  g.manual_seed(0)
  bufs = B.BufferSet(dev, g)
  outs = [bufs.alloc(f"in{j}", x.shape, x.dtype).tensor for j, x in enumerate(want)]
  I.redraw(plan, 2024, outs)
  assert all(torch.equal(B.bytes_of(a), B.bytes_of(b)) for a, b in zip(outs, want))
  assert not bufs.guard_violations()
