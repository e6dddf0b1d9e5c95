"""Tokenizers: bundled small BPE (exact round trip, chat template, special ids, reproducible build), loading."""

import filecmp
import json

import pytest

from kevin_jax.policy import build_tokenizer
from kevin_jax.policy.tokenizer import BUNDLED_DIR, load_tokenizer

CUDA_TEXT = r'''#include <cuda_fp16.h>
extern "C" __global__ void softmax_rows(const float* __restrict__ x, float* y, int rows, int cols) {
  extern __shared__ float smem[];
  int r = blockIdx.x;  // one block per row
	for (int c = threadIdx.x; c < cols; c += blockDim.x) { y[r * cols + c] = __expf(x[r * cols + c]); }
  __syncthreads();
}
'''
PY_TEXT = '''class Model(nn.Module):
    """Zürich naïve café: 中文, emoji 🙂, tabs\tand CRLF\r\n"""
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ self.w.T) ** 2  # <think> stays text here</think>

'''


def test_bundled_round_trips_code_exactly():
  tok = load_tokenizer()
  assert tok.vocab_size == 8192
  for text in (CUDA_TEXT, PY_TEXT, "", " ", "\n\n\n", "a" * 1000, bytes(range(32, 127)).decode()):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.vocab_size for i in ids)
  # Code compresses: well under one token per character on CUDA text.
  assert len(tok.encode(CUDA_TEXT)) < 0.5 * len(CUDA_TEXT)


def test_bundled_special_tokens_and_chat_template():
  tok = load_tokenizer("")
  vocab = tok.hf.get_vocab()
  assert [vocab[t] for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
  assert tok.eos_ids == (0, 2) and tok.pad_id == 0
  think = tok.encode("<think>\nplan</think>")
  assert think[0] == vocab["<think>"] and think[-1] == vocab["</think>"]
  msgs = [{"role": "system", "content": "You write CUDA."}, {"role": "user", "content": "ReLU please"}]
  text = tok.apply_chat_template(msgs)
  assert text == ("<|im_start|>system\nYou write CUDA.<|im_end|>\n<|im_start|>user\nReLU please<|im_end|>\n"
                  "<|im_start|>assistant\n")
  ids = tok.encode_chat(msgs)
  assert ids[0] == 1 and ids.count(2) == 2 and tok.decode(ids) == text
  assert tok.decode(ids, skip_special_tokens=True) == "system\nYou write CUDA.\nuser\nReLU please\nassistant\n"
  assert not tok.apply_chat_template(msgs, add_generation_prompt=False).endswith("assistant\n")


def test_build_is_reproducible(tmp_path):
  info = build_tokenizer.build(str(tmp_path))
  shipped = json.load(open(f"{BUNDLED_DIR}/build_info.json"))
  assert info["vocab_size"] == shipped["vocab_size"] == 8192
  if info["corpus_sha256"] != shipped["corpus_sha256"]:
    keys = ("corpus_files", "corpus_chars", "python", "versions")
    pytest.skip(f"this machine's corpus differs from the shipped build's ({ {k: info[k] for k in keys} } vs "
                f"{ {k: shipped.get(k) for k in keys} }): byte-identity is only defined for the same inputs")
  for name in ("tokenizer.json", "tokenizer_config.json"):
    assert filecmp.cmp(tmp_path / name, f"{BUNDLED_DIR}/{name}", shallow=False), name


def test_checkpoint_dir_tokenizer_and_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    load_tokenizer(tmp_path / "nope")
  with pytest.raises(FileNotFoundError, match="no tokenizer files"):
    load_tokenizer(tmp_path)
  # A checkpoint directory with its own tokenizer files and a generation_config eos list.
  tok = load_tokenizer()
  tok.hf.save_pretrained(tmp_path)
  (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
  loaded = load_tokenizer(tmp_path)
  assert loaded.eos_ids == (0, 2, 7)
  assert loaded.encode(CUDA_TEXT) == tok.encode(CUDA_TEXT)
