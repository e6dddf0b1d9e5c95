"""mode=sft end to end on CPU: tiny policy, 8 fake devices (FSDP 4 x tensor 2), a short-prompt corpus built from
bundled solutions. Loss falls, a run killed after its step-8 checkpoint resumes to the uninterrupted run's
metrics, the HF export loads back with identical parameters, and RL's init_from reads both the HF directory and
the Orbax run; bad corpora are clear errors.
"""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from configs import multiturn
from configs import sft as sft_config
from kevin_jax import checkpoint as ckpt_lib
from kevin_jax import metrics as metrics_lib
from kevin_jax import runtime
from kevin_jax import sft
from kevin_jax.kernels import suite
from kevin_jax.policy.tokenizer import load_tokenizer
from kevin_jax.policy.weights import load_pretrained
from kevin_jax.rl import prompts
from kevin_jax.rl import sft_data

TASKS = ("level1/01_ReLU", "level1/02_GELU", "level1/03_Swish", "level1/04_ELU")
HELD_OUT = "level1/04_ELU"
# Deterministic per-step quantities (timings vary run to run).
COMPARED = ("train/loss", "train/token_acc", "train/grad_norm", "train/lr", "train/tokens", "batch/seq_len",
            "eval/loss", "eval/token_acc", "heldout_tasks/loss", "sample/parse_rate", "sample/len_mean")


def write_corpus(path, max_response_tokens=260):
  """Short prompts (a one-line request) + real bundled solutions whose response fits max_response_tokens."""
  tok = load_tokenizer()
  lines = []
  for tid in TASKS:
    d = os.path.join(suite.SOLUTIONS_DIR, tid)
    for fn in sorted(os.listdir(d)):
      if not fn.endswith(".md"):
        continue
      p = prompts.parse_response(open(os.path.join(d, fn)).read())
      response = prompts.format_response("Okay, elementwise: one thread per element.", p.candidate_text, p.summary)
      if len(tok.encode(response)) > max_response_tokens:
        continue
      messages = [{"role": "system", "content": prompts.SYSTEM},
                  {"role": "user", "content": f"Write CUDA kernels for the KernelBench task {tid}."}]
      lines.append(json.dumps({"messages": messages, "response": response, "task_id": tid, "kind": fn[:-3]}))
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  return len(lines)


def make_config(corpus, steps=16):
  c = sft_config.get_config("runlocal")
  c.sft.corpus = str(corpus)
  c.sft.steps = steps
  c.sft.batch_size = 8
  c.sft.micro_batch_size = 1  # 4 data-parallel devices -> G = 4 rows, 2 accumulated micro-batches per step.
  c.sft.learning_rate = 3e-3  # 1e-2 spikes at step 3 and settles on unigram statistics (acc 0.04).
  c.sft.max_seq_len = 320
  c.sft.seq_buckets = (128, 256)
  c.sft.eval_fraction = 0.2
  c.sft.eval_every_steps = 8
  c.sft.checkpoint_every_steps = 8
  c.sft.sample_prompts = 2
  c.sft.sample_max_new_tokens = 8
  c.sampler.prompt_buckets = (64, 128)
  c.tasks.test_ids = (HELD_OUT,)
  c.mesh.axes = (("fsdp", -1), ("tensor", 2))
  c.logging.tensorboard = False
  return c


class _Crash(RuntimeError):
  pass


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
  assert write_corpus(path) >= 10
  return path


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, corpus):
  workdir = tmp_path_factory.mktemp("full")
  sft.run(make_config(corpus), str(workdir))
  return workdir


def test_loss_falls_and_files_are_written(full_run):
  recs = metrics_lib.read_metrics(str(full_run / "metrics.jsonl"))
  assert list(recs) == list(range(1, 17))
  first, last = recs[1]["train/loss"], recs[16]["train/loss"]
  assert first == pytest.approx(np.log(8192), abs=0.3)  # Random init: ~uniform over the 8,192-token vocabulary.
  assert last < first - 2.0, (first, last)  # Measured: 9.01 -> 6.34 in 16 steps.
  assert recs[16]["eval/loss"] < recs[8]["eval/loss"] - 0.3 < first  # Held-out examples; measured 7.13 -> 6.53.
  assert recs[16]["train/token_acc"] > recs[1]["train/token_acc"] + 0.1  # Measured 0.013 -> 0.19.
  assert "heldout_tasks/loss" in recs[8] and "sample/parse_rate" in recs[16]
  assert recs[16]["train/lr"] < recs[8]["train/lr"] < recs[2]["train/lr"]  # Cosine decay.
  data = json.load(open(full_run / "sft_data.json"))
  assert data["heldout_tasks"] > 0 and data["train"] + data["eval"] + data["heldout_tasks"] == data["kept"]
  assert sorted(os.listdir(full_run / "checkpoints")) == ["16", "8"]
  samples = [json.loads(l) for l in open(full_run / "samples" / "step_000016.jsonl")]
  assert len(samples) == 2 and all(s["finish"] in ("eos", "length") for s in samples)


def test_crash_and_resume_reproduce_the_uninterrupted_run(tmp_path, monkeypatch, corpus, full_run):
  real = sft_data.BatchOrder.indices

  def crashing(self, step):
    if step == 11:
      raise _Crash("simulated kill during step 11")
    return real(self, step)

  monkeypatch.setattr(sft_data.BatchOrder, "indices", crashing)
  with pytest.raises(_Crash):
    sft.run(make_config(corpus), str(tmp_path))
  monkeypatch.setattr(sft_data.BatchOrder, "indices", real)
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["8"] and not os.path.exists(tmp_path / "hf")
  assert max(metrics_lib.read_metrics(str(tmp_path / "metrics.jsonl"))) == 9  # Step 10 was never fetched.
  sft.run(make_config(corpus), str(tmp_path))
  want = metrics_lib.read_metrics(str(full_run / "metrics.jsonl"))
  got = metrics_lib.read_metrics(str(tmp_path / "metrics.jsonl"))
  assert list(got) == list(range(1, 17))
  for step in (9, 10, 16):
    for key in COMPARED:
      if key in want[step]:
        assert got[step][key] == pytest.approx(want[step][key], rel=1e-6, abs=1e-7), (step, key)


def test_hf_export_loads_back_and_feeds_rl(full_run, corpus):
  config = make_config(corpus)
  policy, _ = sft.build_sft(config, runtime.build_policy(config), 16)
  ckpt = ckpt_lib.Checkpointer(str(full_run / "checkpoints"))
  final = jax.device_get(ckpt.restore(policy.learner.abstract_state).state.params)
  ckpt.close()
  model = load_pretrained(str(full_run / "hf"), dtype="float32")
  for a, b in zip(jax.tree.leaves(nnx.state(model, nnx.Param)), jax.tree.leaves(final)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  tok = load_tokenizer(str(full_run / "hf"))
  assert tok.encode("```cuda\n__global__") == load_tokenizer().encode("```cuda\n__global__")
  assert sft_data.end_of_turn_id(tok) in tok.eos_ids
  # The RL job starts from either form of the warm start.
  rl = multiturn.get_config("runlocal")
  rl.mesh.axes = config.mesh.axes
  rl_policy = runtime.build_policy(rl)
  for src in (full_run / "hf", full_run):
    rl.init_from = str(src)
    state = jax.device_get(runtime.initial_state(rl, rl_policy, jax.random.key(1)))
    assert int(state.step) == 0
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(final)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_bad_corpora_are_clear_errors(tmp_path, corpus, full_run):
  c = make_config(tmp_path / "missing.jsonl")
  with pytest.raises(SystemExit, match="does not exist"):
    sft.run(c, str(tmp_path / "w1"))
  (tmp_path / "empty.jsonl").write_text("")
  with pytest.raises(SystemExit, match="holds no examples"):
    sft.run(make_config(tmp_path / "empty.jsonl"), str(tmp_path / "w2"))
  c = make_config(corpus)
  c.sft.max_seq_len = 64
  c.sft.seq_buckets = ()
  with pytest.raises(SystemExit, match="longer than sft.max_seq_len = 64"):
    sft.run(c, str(tmp_path / "w3"))
  c = make_config("")  # The bundled corpus, with a misspelt kind.
  c.sft.corpus_kinds = ("single", "retry_formats")
  with pytest.raises(SystemExit, match="sft.corpus_kinds.*unknown \\['retry_formats'\\]"):
    sft.run(c, str(tmp_path / "w4"))
  c = make_config("")
  c.sft.corpus_reasoning = "terse"
  with pytest.raises(SystemExit, match="sft.corpus_reasoning.*'terse': known: quote, plain"):
    sft.run(c, str(tmp_path / "w5"))
  for w in ("w1", "w2", "w3", "w4", "w5"):
    assert not os.path.exists(tmp_path / w / "checkpoints")
  other = tmp_path / "other.jsonl"
  other.write_text("".join(open(corpus).readlines()[:-1]))  # One example fewer.
  before = open(full_run / "sft_data.json").read()
  with pytest.raises(SystemExit, match="trained on another corpus"):
    sft.run(make_config(other), str(full_run))
  assert open(full_run / "sft_data.json").read() == before


def test_warm_start_runs_once_then_reuses(tmp_path, corpus):
  c = make_config(corpus, steps=2)
  c.mode = "train"  # The RL job's config calls it.
  c.sft.eval_every_steps = 0
  hf = sft.warm_start(c, str(tmp_path / "sft"))
  assert hf == str(tmp_path / "sft" / "hf") and runtime.is_hf_checkpoint(hf)
  stamp = os.path.getmtime(os.path.join(hf, "model.safetensors"))
  lines = open(tmp_path / "sft" / "metrics.jsonl").read().count("\n")
  assert lines == 2
  assert sft.warm_start(c, str(tmp_path / "sft")) == hf  # Finished: nothing retrained or rewritten.
  assert open(tmp_path / "sft" / "metrics.jsonl").read().count("\n") == lines
  assert os.path.getmtime(os.path.join(hf, "model.safetensors")) == stamp
