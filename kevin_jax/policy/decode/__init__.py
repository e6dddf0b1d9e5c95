"""The decode fast path of the sampler: Pallas kernels for one-token decode steps, and the seam the sampler calls.

  plan.py          DecodeConfig (the sampler's choices, 'auto' by default) -> resolve -> a frozen, logged DecodePlan
  step.py          make_step(model, plan): the fused one-token step on a folded copy of the weights
  attention.py     attention over the visible cache slots (split, balanced, merged by XLA)
  qkv.py           input norm + q/k/v projection + RoPE + cache write (+ an L2 prefetch for the attention)
  oproj.py         o projection + residual add
  mlp.py           SwiGLU front (with its norm) and the down projection split along F
  sample_stats.py  the draw's chunk maxima and sums of exp in one pass over the logits
  tiles.py         block sizes, dot loops and device properties shared by the kernels

Dependency direction: sampler -> decode -> model. Nothing outside this package and the sampler (sampler.py,
sampling.py) imports a kernel (tests/test_boundaries.py).
"""
