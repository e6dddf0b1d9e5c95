"""kevin_jax/rl/sft_data.py: corpus format, tokenization and masks, length limits, splits, batch order, errors."""

import json
import os

import numpy as np
import pytest

from kevin_jax.data import export_corpus
from kevin_jax.kernels import suite
from kevin_jax.kernels import tasks as tasks_lib
from kevin_jax.policy.tokenizer import load_tokenizer
from kevin_jax.rl import prompts
from kevin_jax.rl import sft_data as D

TASKS = ("level1/01_ReLU", "level1/03_Swish")


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer()


def fixture_records():
  """Real first-turn prompts (build_messages) + format_response over two bundled tasks' solutions."""
  specs = {s.id: s for s in tasks_lib.discover("bundled")}
  recs = []
  for tid in TASKS:
    for kind in ("naive", "optimized"):
      path = os.path.join(suite.SOLUTIONS_DIR, tid, f"{kind}.md")
      p = prompts.parse_response(open(path).read())
      recs.append({"messages": prompts.build_messages(specs[tid].source), "task_id": tid, "kind": kind,
                   "quality": "correct",
                   "response": prompts.format_response("Okay, one thread per element.", p.candidate_text, p.summary)})
  return recs


def test_end_of_turn_is_im_end(tok):
  assert D.end_of_turn_id(tok) == tok.hf.get_vocab()["<|im_end|>"] == 2


def test_tokenize_prompt_target_and_masks(tok):
  recs = fixture_records()
  exs, st = D.tokenize(recs, tok, max_seq_len=8192, truncate=False)
  assert (st.records, st.kept, st.dropped_too_long) == (4, 4, 0)
  for rec, e in zip(recs, exs):
    assert list(e.prompt_ids) == tok.encode_chat(rec["messages"], add_generation_prompt=True)
    assert e.target_ids[-1] == 2 and tok.decode(e.target_ids[:-1]) == rec["response"]
    assert prompts.parse_response(tok.decode(e.target_ids[:-1])).error == ""
    assert e.task_id == rec["task_id"]
  batch = D.make_batch(exs[:3], rows=4, buckets=(1024, 4096), pad_id=tok.pad_id)
  assert batch.tokens_BxT.shape == (4, 4096)
  for r, e in enumerate(exs[:3]):
    p, n = len(e.prompt_ids), e.length
    np.testing.assert_array_equal(batch.tokens_BxT[r, :n], e.prompt_ids + e.target_ids)
    assert batch.attn_mask_BxT[r].sum() == n and batch.attn_mask_BxT[r, :n].all()
    np.testing.assert_array_equal(np.nonzero(batch.loss_mask_BxT[r])[0], np.arange(p, n))
  assert batch.attn_mask_BxT[3].sum() == 1 and batch.loss_mask_BxT[3].sum() == 0  # Padding row.


def test_input_noise_corrupts_only_read_response_tokens(tok):
  exs, _ = D.tokenize(fixture_records(), tok, max_seq_len=8192, truncate=False)
  clean = D.make_batch(exs, rows=4, buckets=(4096,), pad_id=tok.pad_id)
  assert clean.inputs_BxT is None
  a = D.make_batch(exs, rows=4, buckets=(4096,), pad_id=tok.pad_id, input_noise=0.3, rng=np.random.default_rng(5))
  b = D.make_batch(exs, rows=4, buckets=(4096,), pad_id=tok.pad_id, input_noise=0.3, rng=np.random.default_rng(5))
  np.testing.assert_array_equal(a.inputs_BxT, b.inputs_BxT)  # Seeded: a resumed run redraws the same noise.
  for f in ("tokens_BxT", "attn_mask_BxT", "loss_mask_BxT"):
    np.testing.assert_array_equal(getattr(a, f), getattr(clean, f))  # Targets and masks untouched.
  changed, readable = 0, 0
  for r, e in enumerate(exs):
    p, n = len(e.prompt_ids), e.length
    diff = np.flatnonzero(a.inputs_BxT[r] != a.tokens_BxT[r])
    assert diff.size and diff.min() >= p and diff.max() <= n - 2  # Only response tokens that are read.
    assert set(a.inputs_BxT[r, diff].tolist()) <= set(e.target_ids)  # Replacements come from the response.
    changed += diff.size
    readable += n - 1 - p
  # About 30 % drawn; a draw of the same id leaves a position unchanged, so slightly fewer differ.
  assert 0.2 < changed / readable < 0.33
  with pytest.raises(ValueError, match="input_noise"):
    D.make_batch(exs, rows=4, buckets=(4096,), pad_id=tok.pad_id, input_noise=1.0, rng=np.random.default_rng(0))
  with pytest.raises(ValueError, match="rng"):
    D.make_batch(exs, rows=4, buckets=(4096,), pad_id=tok.pad_id, input_noise=0.1)


def test_length_limit_drops_or_truncates(tok):
  recs = fixture_records()
  full, _ = D.tokenize(recs, tok, max_seq_len=8192, truncate=False)
  limit = sorted(e.length for e in full)[1]  # Two examples fit, two do not.
  kept, st = D.tokenize(recs, tok, max_seq_len=limit, truncate=False)
  assert (st.kept, st.dropped_too_long, st.longest) == (2, 2, max(e.length for e in full))
  cut, st = D.tokenize(recs, tok, max_seq_len=limit, truncate=True)
  assert (st.kept, st.truncated) == (4, 2) and max(e.length for e in cut) == limit
  shortest_prompt = min(len(e.prompt_ids) for e in full)
  _, st = D.tokenize(recs, tok, max_seq_len=shortest_prompt, truncate=True)
  assert st.kept == 0 and st.dropped_too_long == 4  # No room for any response: dropped, even when truncating.


def test_bundled_corpus_is_the_exporters():
  sources = {s.id: s.source for s in tasks_lib.discover("bundled")}
  recs = D.bundled_corpus(TASKS + ("level9/not_a_task",))
  assert {r["task_id"] for r in recs} == set(TASKS)
  singles = [r for r in recs if r["kind"] == "single"]
  assert sorted((r["task_id"], r["target"]) for r in singles) == sorted(
      (t, k) for t in TASKS for k in ("naive", "optimized"))
  assert {r["kind"] for r in recs} <= set(export_corpus.KINDS)  # Multi-turn kinds once suite_results.json exists.
  for r in singles:
    assert r["messages"] == prompts.build_messages(sources[r["task_id"]])
  for r in recs:
    p = prompts.parse_response(r["response"])
    assert p.error == "" and p.reasoning.startswith("Okay,") and "```plan" in p.candidate_text


def test_bundled_corpus_passes_the_reasoning_style():
  quote, plain = D.bundled_corpus(TASKS), D.bundled_corpus(TASKS, reasoning="plain")
  assert [(r["task_id"], r["kind"], r["messages"]) for r in quote] == [
      (r["task_id"], r["kind"], r["messages"]) for r in plain]
  later = [(q["response"], p["response"]) for q, p in zip(quote, plain) if q["kind"] != "single"]
  assert later and all(q != p for q, p in later)  # Needs kevin_jax/data/suite_results.json (committed).


def test_fitted_corpus_shows_the_rollouts_prompts(tok):
  """rollout_fit: each later-turn prompt within the budget, the oldest attempts dropped as a rollout drops them."""
  every = D.bundled_corpus(TASKS, kinds=export_corpus.ALL_KINDS, reasoning="plain")
  def length(r):
    return len(tok.encode_chat(r["messages"], add_generation_prompt=True))
  assert all(r["attempts_dropped"] == 0 for r in every)
  budget = max(length(r) for r in every if r["turn"] <= 2) + 1  # Every prompt with at most one attempt fits.
  over = [r for r in every if length(r) > budget]
  assert over and {r["turn"] for r in over} == {3}  # Two-attempt prompts (needs data/suite_results.json).
  fitted = D.bundled_corpus(TASKS, kinds=export_corpus.ALL_KINDS, reasoning="plain", fit=D.rollout_fit(tok, budget))
  assert len(fitted) == len(every)
  for f, e in zip(fitted, every):
    assert (f["task_id"], f["kind"], f["response"]) == (e["task_id"], e["kind"], e["response"])
    assert length(f) <= budget
    if length(e) <= budget:
      assert f["messages"] == e["messages"] and f["attempts_dropped"] == 0
    else:  # Attempt 1 dropped, attempt 2 kept under its own number: what rollout.rollout's third turn shows.
      assert f["attempts_dropped"] == 1
      user = f["messages"][1]["content"]
      assert "Attempt 2" in user and "Attempt 1" not in user
      assert user.split("Attempt 2", 1)[1] == e["messages"][1]["content"].split("Attempt 2", 1)[1]
  assert D.bundled_corpus(TASKS, kinds=export_corpus.ALL_KINDS, reasoning="plain",
                          fit=D.rollout_fit(tok, 10**6)) == every
  with pytest.raises(ValueError, match="positive"):
    D.rollout_fit(tok, 0)


def test_split_keeps_test_tasks_out_of_training():
  exs = [D.Example((1,), (2, 3), f"t{i % 4}", "") for i in range(40)]
  train, evals, held = D.split(exs, test_task_ids={"t3"}, exclude_test_tasks=True, eval_fraction=0.1, seed=0)
  assert len(held) == 10 and {e.task_id for e in held} == {"t3"}
  assert len(evals) == 3 and len(train) == 27 and not {e.task_id for e in train + evals} & {"t3"}
  train2, evals2, held2 = D.split(exs, test_task_ids={"t3"}, exclude_test_tasks=False, eval_fraction=0.1, seed=0)
  assert not held2 and len(evals2) == 4 and len(train2) == 36


def test_batch_order_is_a_pure_function_of_step():
  lengths = np.random.default_rng(0).integers(10, 1000, 24)
  a = D.BatchOrder(lengths, 6, seed=3, length_group=2)
  b = D.BatchOrder(lengths, 6, seed=3, length_group=2)
  epoch1 = [a.indices(k) for k in range(1, 5)]
  assert sorted(np.concatenate(epoch1).tolist()) == list(range(24))  # Each example once per epoch.
  for k in (7, 2, 5):  # Any order of queries (a resumed run starts mid-stream).
    np.testing.assert_array_equal(b.indices(k), a.indices(k))
  assert not np.array_equal(a.indices(5), a.indices(1))
  # One sorting window per epoch: batches hold disjoint length ranges (minimal padding).
  whole = D.BatchOrder(lengths, 6, seed=3, length_group=4)
  ranges = sorted((lengths[whole.indices(k)].min(), lengths[whole.indices(k)].max()) for k in range(1, 5))
  assert all(hi <= lo_next for (_, hi), (lo_next, _) in zip(ranges, ranges[1:]))
  mixed = D.BatchOrder(lengths, 6, seed=3, length_group=1)
  ranges = sorted((lengths[mixed.indices(k)].min(), lengths[mixed.indices(k)].max()) for k in range(1, 5))
  assert not all(hi <= lo_next for (_, hi), (lo_next, _) in zip(ranges, ranges[1:]))
  odd = D.BatchOrder(lengths[:7], 4, seed=0, length_group=1)  # 7 examples -> 2 full batches per epoch.
  assert odd.batches_per_epoch == 2 and set(np.concatenate([odd.indices(1), odd.indices(2)])) == set(range(7))


def test_corpus_errors(tmp_path):
  with pytest.raises(D.CorpusError, match="does not exist"):
    D.read_corpus(str(tmp_path / "nope.jsonl"))
  (tmp_path / "empty.jsonl").write_text("\n\n")
  with pytest.raises(D.CorpusError, match="holds no examples"):
    D.read_corpus(str(tmp_path / "empty.jsonl"))
  good = {"messages": [{"role": "user", "content": "x"}], "response": "y"}
  (tmp_path / "bad.jsonl").write_text(json.dumps(good) + "\n" + json.dumps({"messages": [], "response": "y"}) + "\n")
  with pytest.raises(D.CorpusError, match=r"bad.jsonl:2: 'messages'"):
    D.read_corpus(str(tmp_path / "bad.jsonl"))
  (tmp_path / "bad2.jsonl").write_text(json.dumps({"messages": good["messages"]}) + "\n")
  with pytest.raises(D.CorpusError, match=r"bad2.jsonl:1: 'response'"):
    D.read_corpus(str(tmp_path / "bad2.jsonl"))
  (tmp_path / "bad3.jsonl").write_text("{not json\n")
  with pytest.raises(D.CorpusError, match=r"bad3.jsonl:1: not JSON"):
    D.read_corpus(str(tmp_path / "bad3.jsonl"))


def test_warm_start_corpus_from_the_token_cache_equals_the_fresh_one(tmp_path):
  """sft.load_data: a second process (a fresh tokenizer object) reads every prompt and response from the token cache
  under evaluator.cache_dir and builds the same examples, splits and digest as a run without a persistent cache."""
  from configs import sft as sft_config  # pylint: disable=g-import-not-at-top
  from kevin_jax import sft  # pylint: disable=g-import-not-at-top
  c = sft_config.get_config("runlocal")
  c.evaluator.cache_dir = str(tmp_path / "cache")
  c.sft.corpus_kinds = export_corpus.KINDS  # Later turns too: their prompts are counted and fitted first.
  c.rollout.max_context_tokens = 1536
  fresh = load_tokenizer()
  fresh.fingerprint = None  # In memory only: each text encoded as before the cache existed.
  want = sft.load_data(c, fresh)
  assert not (tmp_path / "cache").exists()
  cold = sft.load_data(c, load_tokenizer())
  files = os.listdir(tmp_path / "cache" / "tokens")
  assert len(files) == 1 and files[0].endswith(".npz")
  warm_tok = load_tokenizer()
  calls = []
  encode_batch = warm_tok.encode_batch
  warm_tok.encode_batch = lambda texts: calls.append(len(texts)) or encode_batch(texts)
  warm = sft.load_data(c, warm_tok)
  assert calls == []
  for got in (cold, warm):
    assert got.digest == want.digest and got.summary == want.summary
    assert (got.train, got.evals, got.heldout_tasks) == (want.train, want.evals, want.heldout_tasks)
  assert want.summary["records"] > 200 and want.summary["prompts_fitted"] > 100
