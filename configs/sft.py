"""Supervised warm start of the embedded policy on the task suite's corpus, before multi-turn RL.

Run (from the repository root, one GPU; a few minutes for the 'small' preset):
  python -m kevin_jax.main --config=configs/sft.py --workdir=runs/sft
then start RL from it:
  python -m kevin_jax.main --config=configs/multiturn.py --workdir=runs/rl --config.init_from=runs/sft/hf
Presets (after a colon, comma-separated; multiturn.py's presets apply too):
  runlocal   tiny fp32 policy with XLA attention, 4 steps of 4 sequences, short greedy samples: a CPU smoke run
             in minutes.
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
  if "runlocal" in arg.split(","):
    c.policy.attention_impl = "xla"  # CPU (and fp32: cuDNN attention needs bf16).
    c.sft.steps = 4
    c.sft.batch_size = 4
    c.sft.micro_batch_size = 2
    c.sft.learning_rate = 3e-3
    c.sft.max_seq_len = 2048  # Bundled prompts are ~1.6-1.8k tokens: responses are cut (sft.truncate).
    c.sft.truncate = True
    c.sft.eval_every_steps = 2
    c.sft.eval_max_examples = 4
    c.sft.sample_prompts = 2
    c.sft.sample_max_new_tokens = 16
    c.sft.checkpoint_every_steps = 2
    c.logging.progress_every_s = 0.0
  return c
