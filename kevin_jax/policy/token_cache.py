"""Token ids of texts, memoised in memory and on disk, keyed by the tokenizer's fingerprint and each text's sha256.

  cache = TokenCache(tokenizer, path)      # path None: in memory only
  ids = cache.encode_many(texts)           # tuples of ids, as tokenizer.encode gives them
  cache.save()                             # atomically; only when new texts were encoded

A text's ids depend only on the tokenizer and the text, so one file per tokenizer fingerprint
(Tokenizer.fingerprint: its files and library versions) serves every corpus and every process that reads it:
the warm start's corpus (thousands of prompts and responses) is tokenized once per machine, not once per job.
Missing texts are encoded in one batch (the fast tokenizer's threads). The file keeps the texts used by the
latest writer plus older entries up to MAX_TOKENS ids.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from typing import Sequence

import numpy as np
from absl import logging

MAX_TOKENS = 64_000_000  # Ids kept on disk per tokenizer (~256 MB as int32); the latest writer's texts always stay.


def _key(text: str) -> bytes:
  return hashlib.sha256(text.encode("utf-8")).digest()


class TokenCache:
  """See the module docstring."""

  def __init__(self, tokenizer, path: str | None = None):
    self.tokenizer, self.path = tokenizer, path
    self._ids: dict[bytes, np.ndarray] = {}
    self._used: set[bytes] = set()
    self._new = 0
    if path and os.path.isfile(path):
      try:
        with np.load(path) as z:
          keys, offsets, flat = z["keys"], z["offsets"], z["ids"]
        self._ids = {bytes(k): flat[offsets[i]:offsets[i + 1]] for i, k in enumerate(keys)}
      except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # Damaged: a miss, never an error.
        self._ids = {}

  def __len__(self) -> int:
    return len(self._ids)

  @property
  def new(self) -> int:
    """Texts encoded by this object (not found in memory or on disk)."""
    return self._new

  def encode_many(self, texts: Sequence[str]) -> list[tuple[int, ...]]:
    """tokenizer.encode of each text (no special tokens added), the missing ones encoded in one batch."""
    keys = [_key(t) for t in texts]
    missing = {}
    for k, t in zip(keys, texts):
      if k not in self._ids:
        missing.setdefault(k, t)
    if missing:
      encoded = self.tokenizer.encode_batch(list(missing.values()))
      for k, ids in zip(missing, encoded):
        self._ids[k] = np.asarray(ids, np.int32)
      self._new += len(missing)
    self._used.update(keys)
    return [tuple(self._ids[k].tolist()) for k in keys]

  def encode(self, text: str) -> tuple[int, ...]:
    return self.encode_many([text])[0]

  def save(self) -> None:
    """Writes the file atomically (a no-op without a path or without new texts); an I/O error only warns."""
    if not self.path or not self._new:
      return
    keep = [k for k in self._ids if k in self._used]
    total = sum(len(self._ids[k]) for k in keep)
    for k, v in self._ids.items():
      if k not in self._used and total + len(v) <= MAX_TOKENS:
        keep.append(k)
        total += len(v)
    offsets = np.zeros(len(keep) + 1, np.int64)
    offsets[1:] = np.cumsum([len(self._ids[k]) for k in keep])
    flat = np.concatenate([self._ids[k] for k in keep]) if keep else np.zeros(0, np.int32)
    keys = np.frombuffer(b"".join(keep), np.uint8).reshape(len(keep), 32)
    directory = os.path.dirname(self.path) or "."
    try:
      os.makedirs(directory, exist_ok=True)
      fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=directory)
      try:
        with os.fdopen(fd, "wb") as f:
          np.savez(f, keys=keys, offsets=offsets, ids=flat)
        os.replace(tmp, self.path)
      finally:
        if os.path.exists(tmp):
          os.remove(tmp)
    except OSError as e:
      logging.warning("token cache %s not written: %s", self.path, e)
    self._new = 0
