"""kevin_jax/policy/token_cache.py: ids equal the tokenizer's, persist across objects (no re-encoding), survive a
damaged file, and keep the latest texts under the size cap; Tokenizer.fingerprint follows the tokenizer's files."""

import os
import shutil

import pytest

from kevin_jax.policy import token_cache
from kevin_jax.policy.token_cache import TokenCache
from kevin_jax.policy.tokenizer import BUNDLED_DIR, load_tokenizer

TEXTS = ["extern \"C\" __global__ void relu(const float* x, float* y, int n) { }", "Summary: one thread per element.",
         "", "naïve → ∑ 𝔸", "extern \"C\" __global__ void relu(const float* x, float* y, int n) { }"]


class Counting:
  """The bundled tokenizer, counting the texts it is asked to encode."""

  def __init__(self, tok):
    self.tok, self.encoded = tok, 0

  def encode_batch(self, texts):
    self.encoded += len(texts)
    return self.tok.encode_batch(texts)


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer()


def test_ids_are_the_tokenizers_and_each_distinct_text_is_encoded_once(tok):
  counting = Counting(tok)
  cache = TokenCache(counting)
  ids = cache.encode_many(TEXTS)
  assert ids == [tuple(tok.encode(t)) for t in TEXTS]
  assert ids[1] and ids[2] == ()
  assert counting.encoded == cache.new == 4  # The repeated text once.
  assert cache.encode(TEXTS[1]) == ids[1] and counting.encoded == 4
  assert tok.encode_batch(TEXTS) == [tok.encode(t) for t in TEXTS]


def test_saved_ids_are_read_back_without_encoding(tok, tmp_path):
  path = str(tmp_path / "sub" / "tokens.npz")
  first = TokenCache(tok, path)
  want = first.encode_many(TEXTS)
  first.save()
  assert os.path.isfile(path) and not [f for f in os.listdir(tmp_path / "sub") if f.startswith(".tmp")]
  counting = Counting(tok)
  second = TokenCache(counting, path)
  assert len(second) == 4 and second.encode_many(TEXTS) == want
  assert counting.encoded == second.new == 0
  mtime = os.stat(path).st_mtime_ns
  second.save()  # Nothing new: the file is not rewritten.
  assert os.stat(path).st_mtime_ns == mtime
  assert second.encode("one more text") == tuple(tok.encode("one more text")) and second.new == 1
  second.save()
  assert len(TokenCache(tok, path)) == 5


def test_a_damaged_file_is_a_miss(tok, tmp_path):
  path = tmp_path / "tokens.npz"
  path.write_bytes(b"not a zip file")
  cache = TokenCache(tok, str(path))
  assert len(cache) == 0 and cache.encode_many(TEXTS[:2]) == [tuple(tok.encode(t)) for t in TEXTS[:2]]
  cache.save()
  assert len(TokenCache(tok, str(path))) == 2


def test_size_cap_keeps_the_latest_writers_texts(tok, tmp_path, monkeypatch):
  path = str(tmp_path / "tokens.npz")
  old = TokenCache(tok, path)
  old.encode_many(["an old text " * 20])
  old.save()
  cap = len(tok.encode(TEXTS[0])) + len(tok.encode(TEXTS[1]))
  assert len(tok.encode("an old text " * 20)) > 0
  monkeypatch.setattr(token_cache, "MAX_TOKENS", cap)
  new = TokenCache(tok, path)
  new.encode_many(TEXTS[:2])
  new.save()
  counting = Counting(tok)
  back = TokenCache(counting, path)
  assert len(back) == 2 and back.encode_many(TEXTS[:2]) == [tuple(tok.encode(t)) for t in TEXTS[:2]]
  assert counting.encoded == 0


def test_fingerprint_follows_the_tokenizer_files(tok, tmp_path):
  assert tok.fingerprint and load_tokenizer().fingerprint == tok.fingerprint
  copy = tmp_path / "tok"
  shutil.copytree(BUNDLED_DIR, copy)
  assert load_tokenizer(copy).fingerprint == tok.fingerprint  # Same files, same fingerprint.
  cfg = copy / "tokenizer_config.json"
  cfg.write_text(cfg.read_text().replace("{", '{"model_max_length": 12345, ', 1))
  assert load_tokenizer(copy).fingerprint != tok.fingerprint
