"""Tokenizers, loaded offline: a checkpoint directory's (through transformers' AutoTokenizer) or the bundled one.

  tok = load_tokenizer("/ckpts/QwQ-32B")     # '' or None: the bundled 8,192-token tokenizer (data/tokenizer/)
  ids = tok.encode_chat([{"role": "user", "content": "Write a ReLU kernel."}])   # + assistant header
  text = tok.decode(ids)
  tok.eos_ids                                 # ids that end generation, e.g. (<|im_end|>, <|endoftext|>)

Chat templates are the checkpoint's own jinja2 template, rendered by transformers' `apply_chat_template`.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Sequence

BUNDLED_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "tokenizer")
# Tokens that end a chat turn or a document in Qwen-style vocabularies.
_EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")


class Tokenizer:
  """A thin wrapper over a transformers tokenizer with the ids generation needs.

  Attributes:
    hf: the underlying transformers tokenizer.
    eos_ids: token ids that end a sequence (the tokenizer's eos, <|im_end|>, <|endoftext|>, and the
      checkpoint's generation_config.json eos_token_id entries), sorted.
    pad_id: the padding id (pad token, else the first eos id).
    vocab_size: number of token ids the tokenizer can produce (may be below the model's vocab_size).
    fingerprint: sha256 of the tokenizer's files and library versions (load_tokenizer), what a cache of its
      encodings is keyed by; None when unknown (no persistent cache).
  """

  def __init__(self, hf: Any, extra_eos_ids: Sequence[int] = (), fingerprint: str | None = None):
    self.hf = hf
    self.fingerprint = fingerprint
    eos = set(int(i) for i in extra_eos_ids)
    if hf.eos_token_id is not None:
      eos.add(int(hf.eos_token_id))
    vocab = hf.get_vocab()
    eos.update(vocab[t] for t in _EOS_TOKENS if t in vocab)
    if not eos:
      raise ValueError("tokenizer defines no end-of-sequence token")
    self.eos_ids: tuple[int, ...] = tuple(sorted(eos))
    self.pad_id: int = int(hf.pad_token_id) if hf.pad_token_id is not None else self.eos_ids[0]
    self.vocab_size: int = len(hf)

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, without any added BOS/EOS."""
    return list(self.hf.encode(text, add_special_tokens=False))

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """`encode` of each text, in one call (a fast tokenizer encodes the batch on several threads)."""
    if not texts:
      return []
    return [list(ids) for ids in self.hf(list(texts), add_special_tokens=False)["input_ids"]]

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens,
                          clean_up_tokenization_spaces=False)

  def apply_chat_template(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """The chat-formatted text of `messages` ([{'role': ..., 'content': ...}]), via the jinja2 template."""
    if not getattr(self.hf, "chat_template", None):
      raise ValueError("this tokenizer has no chat_template")
    return self.hf.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)

  def encode_chat(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
    return self.encode(self.apply_chat_template(messages, add_generation_prompt))


def load_tokenizer(path: str | os.PathLike | None = None) -> Tokenizer:
  """Loads a tokenizer from a local directory (never the network); '' or None = the bundled small tokenizer.

  Raises:
    FileNotFoundError: the directory does not exist or holds no tokenizer files.
  """
  path = os.fspath(path) if path else BUNDLED_DIR
  if not os.path.isdir(path):
    raise FileNotFoundError(f"tokenizer directory {path} does not exist")
  if not any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "vocab.json", "tokenizer.model")):
    raise FileNotFoundError(f"no tokenizer files (tokenizer.json / vocab.json) in {path}")
  from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
  hf = AutoTokenizer.from_pretrained(path, local_files_only=True)
  extra: list[int] = []
  gen_cfg = os.path.join(path, "generation_config.json")
  if os.path.isfile(gen_cfg):
    with open(gen_cfg) as fh:
      eos = json.load(fh).get("eos_token_id")
    extra = [eos] if isinstance(eos, int) else list(eos or [])
  return Tokenizer(hf, extra, fingerprint=_fingerprint(path, type(hf).__name__))


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model",
                    "special_tokens_map.json", "added_tokens.json", "generation_config.json")


def _fingerprint(path: str, cls: str) -> str:
  """sha256 over the directory's tokenizer files and the libraries that read them."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  h = hashlib.sha256(f"{cls}|{transformers.__version__}|{tokenizers.__version__}".encode())
  for name in _TOKENIZER_FILES:
    f = os.path.join(path, name)
    if os.path.isfile(f):
      with open(f, "rb") as fh:
        h.update(name.encode() + b"\0" + hashlib.sha256(fh.read()).digest())
  return h.hexdigest()
