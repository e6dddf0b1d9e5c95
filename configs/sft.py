"""Supervised warm start of the embedded policy on the task suite's corpus, before multi-turn RL.

Run (from the repository root, one GPU; a few minutes for the 'small' preset):
  python -m kevin_jax.main --config=configs/sft.py --workdir=runs/sft
then start RL from it:
  python -m kevin_jax.main --config=configs/multiturn.py --workdir=runs/rl --config.init_from=runs/sft/hf
Presets (after a colon, comma-separated; multiturn.py's presets apply too):
  runlocal   tiny fp32 policy with XLA attention, 4 steps of 4 sequences of 2048 tokens (first-attempt examples,
             responses cut there), short greedy samples: a CPU smoke run in about a minute.
Every sft.* field is declared (and commented) in configs/multiturn.py; override any: --config.sft.steps=200.
Attention defaults to cuDNN flash attention (GPU, bf16): XLA's einsum attention materialises [B, N, T, T] fp32
scores, ~1 GiB per layer per 8 sequences of 4k tokens; use --config.policy.attention_impl=xla elsewhere.
"""

import ml_collections

from configs import multiturn


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  c = multiturn.get_config(arg)
  c.mode = "sft"  # Run kevin_jax/sft.py.
  c.evaluator.backend = "scripted"  # SFT evaluates no kernels: no evaluator workers, JAX gets the whole GPU.
  c.policy.attention_impl = "cudnn"  # Flash attention for training sequences of 2-5k tokens (module docstring).
  if "runlocal" in arg.split(","):  # On top of multiturn.py's runlocal warm start (2048 tokens, 4 sequences).
    c.policy.attention_impl = "xla"  # CPU (and fp32: cuDNN attention needs bf16).
    c.sft.steps = 4
    c.sft.learning_rate = 3e-3
    c.logging.progress_every_s = 0.0
  return c
