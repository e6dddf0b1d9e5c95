"""Memory knobs change memory, not results: gradient accumulation, remat, the layer scan; the memcheck CLI.

Memory is XLA's compiled buffer assignment (memory_analysis().temp_size_in_bytes) on the CPU backend.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from kevin_jax.policy.config import get_preset
from kevin_jax.policy.model import Qwen2
from kevin_jax.rl import memcheck
from tests.test_learner import TINY, init_params_host, make_batch, make_learner, rel_err

DEEP = get_preset("tiny", param_dtype="float32", compute_dtype="float32", num_layers=4)
ROWS, LEN = 8, 128


def _run(micro_batch: int, remat: str):
  """Compiles (abstractly) and runs one learner step; returns temp bytes, metrics, new params."""
  lrn = make_learner((1, 1), model_cfg=DEEP.replace(remat=remat), micro_batch_size=micro_batch, logits_chunk=32)
  compiled = lrn.compile(ROWS, LEN)
  params = nnx.state(Qwen2(DEEP, rngs=nnx.Rngs(params=jax.random.key(1))), nnx.Param)
  state = lrn.state_from_params(jax.device_put(params, lrn.param_shardings))
  state, metrics = compiled(state, lrn.put_batch(make_batch(ROWS, LEN, seed=3)))
  return compiled.memory_analysis().temp_size_in_bytes, jax.device_get(metrics), jax.device_get(state.params)


@pytest.fixture(scope="module")
def runs():
  # (micro-batch per device, remat): G = 4 rows -> M = 1 micro-batch per minibatch; G = 1 -> M = 4.
  return {key: _run(*key) for key in [(4, "none"), (1, "none"), (4, "full")]}


@pytest.mark.parametrize("key", [(1, "none"), (4, "full")])
def test_same_results(runs, key):
  _, ref_metrics, ref_params = runs[(4, "none")]
  _, metrics, params = runs[key]
  for k in ("loss", "loss_first", "grad_norm_first", "grad_norm", "entropy"):
    np.testing.assert_allclose(metrics[k], ref_metrics[k], rtol=1e-5, err_msg=f"{key} {k}")
  assert rel_err(params, ref_params) <= 1e-5


def test_accumulation_and_remat_reduce_temporaries(runs):
  base, accum, remat = (runs[k][0] for k in [(4, "none"), (1, "none"), (4, "full")])
  print(f"temp bytes: base {base}, 4x accumulation {accum}, remat full {remat}")
  assert accum < 0.6 * base, (accum, base)  # Activations of 1 row instead of 4 per micro-batch.
  assert remat < 0.6 * base, (remat, base)  # One layer's activations instead of four.


def test_layer_scan_matches_model_hidden():
  cfg = TINY.replace(remat="full")
  graphdef = nnx.graphdef(nnx.eval_shape(lambda: Qwen2(cfg, rngs=nnx.Rngs(0))))
  params = init_params_host()
  tok = jax.random.randint(jax.random.key(1), (2, 16), 0, cfg.vocab_size)
  pos = jnp.broadcast_to(jnp.arange(16), (2, 16))
  mask = jnp.ones((2, 16), jnp.int32).at[1, 12:].set(0)

  def loss(p, scan):
    m = nnx.merge(graphdef, p)
    h = m.hidden(tok, pos, mask, scan=scan)[0]
    return jnp.sum(jnp.sin(h) * mask[..., None]), h

  vg = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
  (l0, h0), g0 = vg(params, False)
  (l1, h1), g1 = vg(params, True)
  np.testing.assert_allclose(h1, h0, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(l1, l0, rtol=1e-6)
  assert rel_err(g1, g0) <= 1e-5


def test_memcheck_reports_sharded_state(cpu_devices8, capsys, tmp_path):
  del cpu_devices8
  rc = memcheck.main(["--preset", "tiny", "--seq-len", "32", "--mesh", "fsdp=4,tensor=2", "--micro-batch", "1",
                      "--remat", "full", "--backend", "cpu", "--logits-chunk", "16",
                      "--json", str(tmp_path / "r.json")])
  out = capsys.readouterr().out
  assert rc == 0 and "peak estimate" in out and ": fits" in out
  r = json.loads((tmp_path / "r.json").read_text())
  assert r["mesh"] == {"fsdp": 4, "tensor": 2} and r["attention"] == "xla" and r["master_weights"]
  b = r["per_device_bytes"]
  state = b["state_params"] + b["state_master"] + b["state_optimizer"]
  # bf16 params, an fp32 master and two fp32 Adam moments: 2 + 4 + 8 bytes per parameter shard element.
  assert b["state_master"] == 2 * b["state_params"] and b["state_optimizer"] >= 2 * b["state_master"]
  # The tiny model has 0.55M parameters; 8 devices hold 1/8 of most of them, nothing holds less.
  assert 2 * get_preset("tiny").num_params() / 8 <= b["state_params"] <= 2 * get_preset("tiny").num_params()
  assert b["aliased"] >= state  # The donated state's buffers are reused for the new state.
  assert b["arguments"] >= state and r["batch_rows"] == 2 * 1 * 4  # updates x micro-batch x fsdp.


@pytest.mark.parametrize("scan,remat", [(False, "none"), (True, "full")])
def test_golden_logprob_loss_and_grads(scan, remat):
  """A golden regression of the learner's forward/backward (rl/logprobs.token_logps through Qwen2.hidden) on a
  tiny fp32 model with fixed seeds: the summed log-prob and the summed |gradient| equal the values recorded before
  the decode fast path moved out of the model (commit 8875b8c). Update them only for an intended change of the
  model's math (e.g. a new initialiser), never to make a refactor pass."""
  from kevin_jax.rl.logprobs import token_logps  # pylint: disable=g-import-not-at-top
  cfg = get_preset("tiny", param_dtype="float32", compute_dtype="float32", vocab_size=512, remat=remat)
  rng = np.random.RandomState(0)
  for n in (5, 11, 3, 8, 20):  # the recorded run drew its prompts first
    rng.randint(0, 512, n)
  tok = jnp.asarray(rng.randint(0, 512, (2, 24)), jnp.int32)
  mask = jnp.asarray(np.arange(24)[None] < np.array([[24], [17]]), jnp.int32)
  graphdef, state = nnx.split(Qwen2(cfg, rngs=nnx.Rngs(3)))

  def loss(st):
    lp, _ = token_logps(nnx.merge(graphdef, st), tok, mask, chunk=8, with_entropy=False, scan_layers=scan)
    return jnp.sum(lp * mask)

  value, grads = jax.jit(jax.value_and_grad(loss))(state)
  np.testing.assert_allclose(float(value), -242.86627197265625, rtol=1e-6)
  total = sum(float(jnp.sum(jnp.abs(g))) for g in jax.tree.leaves(grads))
  np.testing.assert_allclose(total, 11733.16575415805, rtol=1e-5)
