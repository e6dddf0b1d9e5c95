"""kevin_jax: multi-turn GRPO for CUDA-kernel-writing policies, in JAX/Flax.

Importing the package imports nothing heavy: the learner side (policy/, rl/, train.py) uses JAX, the evaluator
side (kernels/) uses PyTorch and CuPy, and neither world imports the other (tests/test_boundaries.py).
"""

__version__ = "0.1.0"
