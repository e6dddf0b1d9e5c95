"""Command-line generation from a local Hugging Face Qwen2 checkpoint.

  python -m kevin_jax.policy.generate --checkpoint DIR --prompt TEXT --max-new-tokens N [--temperature T] [--chat]

Prints the completion of the raw prompt text (greedy at temperature 0, the default); --chat first wraps the
prompt as one user message in the tokenizer's chat template (with the assistant header). The tokenizer comes
from --tokenizer, else the checkpoint directory, else the bundled small tokenizer.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def _has_tokenizer(path: str) -> bool:
  return any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "vocab.json", "tokenizer.model"))


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--checkpoint", required=True, help="HF checkpoint directory (config.json + safetensors)")
  parser.add_argument("--prompt", required=True, help="prompt text")
  parser.add_argument("--max-new-tokens", type=int, default=128)
  parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
  parser.add_argument("--top-p", type=float, default=1.0)
  parser.add_argument("--top-k", type=int, default=0)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
  parser.add_argument("--system", default=None, help="system message (with --chat)")
  parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: checkpoint, else bundled)")
  parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                      help="parameter/compute dtype (default: float32 on CPU, bfloat16 on accelerators)")
  parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
  parser.add_argument("--verbose", action="store_true", help="print token count, finish reason and timing")
  args = parser.parse_args(argv)

  import jax  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy.sampler import Sampler, SamplerConfig  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy.tokenizer import load_tokenizer  # pylint: disable=g-import-not-at-top
  from kevin_jax.policy.weights import load_pretrained  # pylint: disable=g-import-not-at-top

  dtype = args.dtype or ("float32" if jax.default_backend() == "cpu" else "bfloat16")
  tok_dir = args.tokenizer or (args.checkpoint if _has_tokenizer(args.checkpoint) else None)
  tokenizer = load_tokenizer(tok_dir)
  t0 = time.time()
  model = load_pretrained(args.checkpoint, dtype=dtype, compute_dtype=dtype)
  if args.chat:
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.prompt}]
    prompt_ids = tokenizer.encode_chat(messages)
  else:
    prompt_ids = tokenizer.encode(args.prompt)
  if not prompt_ids:
    parser.error("the prompt encodes to no tokens")
  bucket = max(16, 1 << (len(prompt_ids) - 1).bit_length())
  sampler = Sampler(model.cfg, tokenizer, SamplerConfig(batch_size=1, prompt_buckets=(bucket,),
                                                        kv_cache_dtype=dtype))
  out = sampler.generate(model, [prompt_ids], seed=args.seed, max_new_tokens=args.max_new_tokens,
                         temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, stop_strings=args.stop)
  print(out.text[0])
  if args.verbose:
    print(f"[{len(out.tokens[0])} tokens, finish={out.finish_reason[0]}, prompt={len(prompt_ids)} tokens, "
          f"{time.time() - t0:.1f}s incl. load and compile]", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
