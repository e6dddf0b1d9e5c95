"""Builds the bundled small tokenizer (kevin_jax/data/tokenizer/) from text already on this machine.

  python -m kevin_jax.policy.build_tokenizer [--out kevin_jax/data/tokenizer] [--vocab-size 8192]

A Qwen-style byte-level BPE (same pre-tokenizer regex and byte-to-unicode alphabet as Qwen2, no
normalizer so every byte string round-trips exactly), trained with the `tokenizers` library on, in sorted
path order: the CUDA headers of the nvidia-cuda-runtime / nvidia-cuda-cccl wheels, the top-level modules of
the Python standard library, and torch.nn's module sources (PyTorch reference programs look like them).
Nothing from this repository is read, so the vocabulary does not drift as the repo changes. No network. The
same inputs give byte-identical files (checked by tests/test_policy_tokenizer.py); build_info.json records
the inputs' versions, size and digest, since another Python/CUDA/torch version gives a different (equally
valid) vocabulary.

Special tokens (ids 0-2): <|endoftext|> (padding / document end), <|im_start|>, <|im_end|> (end of turn,
the EOS of chat generation); <think>, </think> are the last two ids (added tokens, kept when decoding). Template:
<|im_start|>{role}\\n{content}<|im_end|>\\n per message, then <|im_start|>assistant\\n for the reply.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
import sysconfig

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
THINK_TOKENS = ("<think>", "</think>")
# Qwen2's pre-tokenizer split (contractions, letters, single digits, punctuation runs, newlines, spaces).
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = ("{%- for message in messages %}"
                 "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
                 "{%- endfor %}"
                 "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_OUT = os.path.join(_REPO, "kevin_jax", "data", "tokenizer")


def corpus_files() -> list[str]:
  """The training files: Python's stdlib, then the CUDA runtime and CCCL headers, then torch.nn's sources, each
  group sorted and deduplicated (the order, and so the corpus digest, does not depend on where the packages are
  installed); raises if a source is missing."""
  import nvidia  # pylint: disable=g-import-not-at-top  (namespace package of the nvidia-* wheels)
  roots = [os.path.join(p, sub, "include") for p in nvidia.__path__ for sub in ("cuda_runtime", "cuda_cccl")]
  headers = [f for root in roots for ext in ("h", "hpp", "cuh", "inl")
             for f in glob.glob(os.path.join(root, "**", f"*.{ext}"), recursive=True)]
  if not headers:
    raise FileNotFoundError(f"no CUDA headers under {roots}: install nvidia-cuda-runtime-cu12/nvidia-cuda-cccl-cu12")
  stdlib = glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py"))
  spec = importlib.util.find_spec("torch")  # located, never imported (the learner side does not import torch)
  if spec is None or not spec.origin:
    raise FileNotFoundError("torch is not installed: its torch/nn sources are part of the corpus")
  torch_dir = os.path.dirname(spec.origin)
  torch_nn = glob.glob(os.path.join(torch_dir, "nn", "modules", "*.py")) + [os.path.join(torch_dir, "nn",
                                                                                           "functional.py")]
  files, seen = [], set()
  for group in (stdlib, headers, torch_nn):
    for f in sorted({os.path.realpath(f) for f in group if os.path.isfile(f)}):
      if f not in seen:
        seen.add(f)
        files.append(f)
  return files


def _read(path: str) -> str:
  with open(path, "rb") as fh:
    return fh.read().decode("utf-8", errors="replace")


def build(out_dir: str, vocab_size: int = 8192) -> dict:
  """Trains the tokenizer and writes tokenizer.json, tokenizer_config.json and build_info.json to out_dir."""
  from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top
  from tokenizers import AddedToken  # pylint: disable=g-import-not-at-top
  files = corpus_files()
  digest = hashlib.sha256()
  texts = []
  for f in files:
    t = _read(f)
    digest.update(t.encode("utf-8"))
    texts.append(t)
  tok = Tokenizer(models.BPE(byte_fallback=False, fuse_unk=False))
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
  ])
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size - len(THINK_TOKENS), min_frequency=2, show_progress=False,
      special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
  tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
  os.makedirs(out_dir, exist_ok=True)
  tok.save(os.path.join(out_dir, "tokenizer.json"), pretty=False)
  config = {
      "tokenizer_class": "PreTrainedTokenizerFast",
      "model_max_length": 32768,
      "bos_token": None,
      "eos_token": "<|im_end|>",
      "pad_token": "<|endoftext|>",
      "unk_token": None,
      "add_bos_token": False,
      "add_eos_token": False,
      "clean_up_tokenization_spaces": False,
      "chat_template": CHAT_TEMPLATE,
  }
  with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as fh:
    json.dump(config, fh, indent=2)
    fh.write("\n")

  def version(pkg):
    try:
      return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
      return None

  info = {
      "command": "python -m kevin_jax.policy.build_tokenizer",
      "vocab_size": tok.get_vocab_size(with_added_tokens=True),
      "corpus_files": len(files),
      "corpus_chars": sum(len(t) for t in texts),
      "corpus_sha256": digest.hexdigest(),
      "python": sys.version.split()[0],
      "versions": {p: version(p) for p in ("tokenizers", "torch", "nvidia-cuda-runtime-cu12",
                                           "nvidia-cuda-cccl-cu12")},
  }
  with open(os.path.join(out_dir, "build_info.json"), "w") as fh:
    json.dump(info, fh, indent=2)
    fh.write("\n")
  return info


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default=DEFAULT_OUT)
  parser.add_argument("--vocab-size", type=int, default=8192)
  args = parser.parse_args(argv)
  info = build(args.out, args.vocab_size)
  print(json.dumps(info, indent=2))


if __name__ == "__main__":
  main()
