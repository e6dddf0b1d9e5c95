"""Plan parsing, the safe expression evaluator, and validation against tasks (kevin_jax/kernels/plan.py)."""

import os

import pytest

from kevin_jax.kernels import tasks
from kevin_jax.kernels.candidate import parse_candidate, parse_kernels
from kevin_jax.kernels.plan import Limits, PlanEnv, PlanError, TensorMeta, bind_plan, evaluate, parse_plan
from kevin_jax.kernels.taskinfo import analyze_task

DATA = os.path.join(os.path.dirname(__file__), "data", "eval")


@pytest.fixture(scope="module")
def infos():
  return {s.id: analyze_task(s) for s in tasks.discover(os.path.join(DATA, "tasks"))}


def candidate(name):
  with open(os.path.join(DATA, "candidates", name + ".md"), encoding="utf-8") as f:
    return parse_candidate(f.read())


def ev(text, tensors=None, scalars=None, allow_float=False):
  env = PlanEnv(tensors=tensors or {"x": TensorMeta((6, 10, 7), "float32", "input")}, scalars=scalars or {"k": 5})
  node = parse_plan(f"launch f grid=({text},) block=(1,) args=()").launches[0].grid[0]
  return evaluate(node, env, "test", allow_float=allow_float)


@pytest.mark.parametrize("expr,value", [
    ("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("7 // 2", 3), ("-7 // 2", -4), ("7 % 3", 1), ("-7 % 3", 2),
    ("cdiv(7, 2)", 4), ("cdiv(8, 2)", 4), ("ceil_div(x.numel, 256)", 2), ("min(3, k, 9)", 3), ("max(1, k)", 5),
    ("x.shape[0]", 6), ("x.shape[-1]", 7), ("x.shape[k - 4]", 10), ("x.numel", 420), ("x.ndim", 3),
    ("x.size(1)", 10), ("x.numel()", 420), ("0x10", 16), ("2**0", None), ("--3", 3),
])
def test_expression_values(expr, value):
  if value is None:
    with pytest.raises(PlanError):
      ev(expr)
  else:
    assert ev(expr) == value


def test_float_values_only_in_args():
  assert ev("1e-5", allow_float=True) == 1e-5
  assert ev("x.numel / 8", allow_float=True) == 52.5
  assert ev("2.0f", allow_float=True) == 2.0
  with pytest.raises(PlanError, match="expected an integer"):
    ev("2.5")
  with pytest.raises(PlanError, match="true division"):
    ev("x.numel / 2")


@pytest.mark.parametrize("expr,message", [
    ("1 // 0", "division by zero"), ("cdiv(1, 0)", "divisor must be positive"), ("x.shape[3]", "out of range"),
    ("y.numel", "unknown tensor 'y'"), ("zz", "unknown name 'zz'"), ("x", "'x' is a tensor"),
    ("2 * 9223372036854775807", "overflow"), ("cdiv(1, 2, 3)", "cdiv takes 2 arguments"),
    ("__import__('os')", "unexpected character"), ("x.__class__", "unknown name 'x.__class__'"),
    ("k; 1", "unexpected character"), ("[1]", "expected a number"),
])
def test_expression_errors(expr, message):
  with pytest.raises(PlanError) as e:
    ev(expr)
  assert message in str(e.value)


def test_plan_syntax_forms():
  plan = parse_plan("""
# a comment
scratch m: float32[x.shape[0], 4] zero   # trailing comment
scratch t: int64[8,]
launch k1 grid=cdiv(x.numel, 256) block=(256,) args=(x, m)
launch k2 grid=(4, 2) block=(32, 8, 1) shared_mem=1024 args=(
    x, t,
    1e-5,
)
launch k3 grid=((x.numel + 255) // 256) block=256 args=()
""")
  assert [s.name for s in plan.scratch] == ["m", "t"]
  assert [s.zero for s in plan.scratch] == [True, False]
  assert [l.kernel for l in plan.launches] == ["k1", "k2", "k3"]
  assert [l.line for l in plan.launches] == [5, 6, 10]
  assert len(plan.launches[0].grid) == 1 and len(plan.launches[1].block) == 3
  assert plan.launches[1].smem == ("num", 1024)
  assert len(plan.launches[1].args) == 3 and plan.launches[2].args == ()


@pytest.mark.parametrize("text,message", [
    ("", "the plan has no launch statement"),
    ("run k grid=(1,) block=(1,) args=()", "starts with 'launch' or 'scratch'"),
    ("launch k grid=(1,) args=()", "missing block="),
    ("launch k grid=(1,) block=(1,) args=() color=3", "unknown launch field 'color'"),
    ("launch k grid=(1,) grid=(2,) block=(1,) args=()", "grid= given twice"),
    ("launch k grid=(1, 1, 1, 1) block=(1,) args=()", "grid= needs 1 to 3 dimensions"),
    ("launch k grid=(1,) block=(1,) args=(x", "unbalanced parentheses"),
    ("scratch s: float99[4]\nlaunch k grid=(1,) block=(1,) args=()", "unknown dtype 'float99'"),
    ("scratch s: float32[4] ones\nlaunch k grid=(1,) block=(1,) args=()", "only 'zero' may follow"),
    ("\n".join(["launch k grid=(1,) block=(1,) args=()"] * 17), "too many launches: 17 (limit 16)"),
    ("\n".join([f"scratch s{i}: float32[1]" for i in range(9)]) + "\nlaunch k grid=(1,) block=(1,) args=()",
     "too many scratch buffers: 9 (limit 8)"),
    ("\n" * 300 + "launch k grid=(1,) block=(1,) args=()", "plan too long: 301 lines"),
])
def test_plan_syntax_errors(text, message):
  with pytest.raises(PlanError) as e:
    parse_plan(text)
  assert message in str(e.value)


def test_names_of_a_task(infos):
  env = infos["linear_relu"].plan_env()
  assert env.tensors["linear.weight"] == TensorMeta((384, 256), "float32", "param")
  assert env.tensors["x"].role == "input" and env.tensor("in0") == env.tensors["x"]
  assert env.tensor("out") == env.tensors["out0"] == TensorMeta((512, 384), "float32", "output")
  assert env.scalars == {"in_features": 256, "out_features": 384, "scale": 2.0}
  two = infos["two_outputs"].plan_env()
  assert two.tensor("out") is None and two.tensor("out1").shape == (1024,)
  emb = infos["embedding"].plan_env()
  assert emb.tensors["idx"].dtype == "int64" and emb.tensors["emb.weight"].shape == (1000, 128)


def test_bind_linear_relu_numbers(infos):
  c = candidate("linear_relu")
  info = infos["linear_relu"]
  bound = bind_plan(parse_plan(c.plan_text), info.plan_env(), c.kernels, Limits(), info.output_names)
  (l,) = bound.launches
  assert l.grid == (3, 512, 1) and l.block == (128, 1, 1) and l.smem == 0
  assert l.args == (("tensor", "x"), ("tensor", "linear.weight"), ("tensor", "linear.bias"), ("tensor", "out0"),
                    ("scalar", "int32", 512), ("scalar", "int32", 256), ("scalar", "int32", 384),
                    ("scalar", "float32", 2.0))


@pytest.mark.parametrize("name", ["relu_1ms", "softmax_1ms", "matmul_1ms", "vec_add", "row_sum", "linear_relu",
                                  "two_outputs", "embedding", "row_sum_scratch"])
def test_bundled_candidates_bind(infos, name):
  task = "row_sum" if name == "row_sum_scratch" else name
  c = candidate(name)
  info = infos[task]
  bound = bind_plan(parse_plan(c.plan_text), info.plan_env(), c.kernels, Limits(), info.output_names)
  assert bound.launches
  if name == "softmax_1ms":
    assert bound.launches[0].smem == 16384 * 4 and bound.launches[0].grid == (16384, 1, 1)
  if name == "row_sum_scratch":
    assert bound.scratch == (("tmp", "float32", (4096,), True),)


SRC = '''
extern "C" __global__ void add(const float* x, const float* y, float* out, long long n) {}
extern "C" __global__ void iadd(const int* x, float* out, int n) {}
extern "C" __global__ void flag(float* out, bool b, unsigned int u) {}
extern "C" __global__ void ro(const float* out) {}
'''


@pytest.mark.parametrize("plan,message", [
    ("launch nope grid=(1,) block=(1,) args=()", "unknown kernel 'nope' (extern \"C\" __global__ kernels in the "
                                                 "source: add, flag, iadd, ro)"),
    ("launch add grid=(1,) block=(1,) args=(x, y, out)", "3 arguments given but kernel add takes 4 "
                                                         "(const float* x, const float* y, float* out, long long n)"),
    ("launch add grid=(1,) block=(1,) args=(x, 3, out, 4)", "argument 2 (parameter 'const float* y'): a pointer "
                                                           "parameter needs a tensor name"),
    ("launch add grid=(1,) block=(1,) args=(x, y, out, y)", "'y' is a tensor but the parameter is a long long"),
    ("launch add grid=(1,) block=(1,) args=(x, q, out, 4)", "unknown tensor 'q'"),
    ("launch iadd grid=(1,) block=(1,) args=(x, out, 4)", "'x' is float32, which does not match int*"),
    ("launch iadd grid=(1,) block=(1,) args=(x, out, 1e-5)", "'x' is float32"),
    ("launch add grid=(1,) block=(1,) args=(x, y, out, 1.5)", "1.5 is not an integer"),
    ("launch flag grid=(1,) block=(1,) args=(out, 2, 1)", "2 is not a bool"),
    ("launch flag grid=(1,) block=(1,) args=(out, 1, -1)", "-1 does not fit in unsigned int"),
    ("launch add grid=(1, 70000) block=(1,) args=(x, y, out, 1)", "grid y = 70000 exceeds the device limit 65535"),
    ("launch add grid=(0,) block=(1,) args=(x, y, out, 1)", "grid dimension x is 0"),
    ("launch add grid=(1,) block=(2048,) args=(x, y, out, 1)", "block x = 2048 exceeds the device limit 1024"),
    ("launch add grid=(1,) block=(64, 32) args=(x, y, out, 1)", "block has 2048 threads (limit 1024)"),
    ("launch add grid=(1,) block=(1, 1, 65) args=(x, y, out, 1)", "block z = 65 exceeds the device limit 64"),
    ("launch add grid=(1,) block=(1,) smem=232449 args=(x, y, out, 1)", "smem = 232449 bytes exceeds the device "
                                                                       "limit 232448"),
    ("launch add grid=(1,) block=(1,) smem=-4 args=(x, y, out, 1)", "smem is negative"),
    ("launch ro grid=(1,) block=(1,) args=(out)", "output 'out' is only passed to const pointer parameters"),
    ("launch flag grid=(1,) block=(1,) args=(x, 1, 1)", "output 'out' is never passed to a kernel"),
    ("scratch x: float32[4]\nlaunch add grid=(1,) block=(1,) args=(x, y, out, 1)", "scratch name 'x' is already "
                                                                                   "used"),
    ("scratch s: float64[2**31]\nlaunch add grid=(1,) block=(1,) args=(x, y, out, 1)", "got '*'"),
    ("scratch s: float64[1 << 30, 2]\nlaunch add grid=(1,) block=(1,) args=(x, y, out, 1)", "unexpected character"),
    ("scratch s: float64[1073741824, 2]\nlaunch add grid=(1,) block=(1,) args=(x, y, out, 1)",
     "scratch buffers total 17179869184 bytes (limit 8589934592)"),
])
def test_bind_errors(infos, plan, message):
  info = infos["vec_add"]
  with pytest.raises(PlanError) as e:
    bind_plan(parse_plan(plan), info.plan_env(), parse_kernels(SRC), Limits(), info.output_names)
  assert message in str(e.value)


def test_multi_output_task_needs_both_outputs(infos):
  info = infos["two_outputs"]
  c = candidate("two_outputs")
  plan = parse_plan(c.plan_text.replace("launch rowsum", "# launch rowsum"))
  with pytest.raises(PlanError, match="output 'out1' is never passed to a kernel"):
    bind_plan(plan, info.plan_env(), c.kernels, Limits(), info.output_names)
  with pytest.raises(PlanError, match="unknown tensor 'out'"):
    bind_plan(parse_plan(c.plan_text.replace("out0", "out")), info.plan_env(), c.kernels, Limits(), info.output_names)


def test_device_limits_are_respected(infos):
  info = infos["vec_add"]
  small = Limits(max_smem=49152, max_threads=512, max_block=(512, 512, 64))
  with pytest.raises(PlanError, match="exceeds the device limit 512"):
    bind_plan(parse_plan("launch add grid=(1,) block=(1024,) args=(x, y, out, 1)"), info.plan_env(),
              parse_kernels(SRC), small, info.output_names)
