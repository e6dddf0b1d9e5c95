"""The generated task world: seeded KernelBench-format task families, a kernel writer and held-out splits.

  spec.py      the spec grammar (Spec), held-out rules, the eager-time cost model
  ops.py       the elementwise op vocabulary (PyTorch text, CUDA text, a pure-Python model for health checks)
  render.py    task module and candidate text
  cuda.py      CUDA reductions shared by the styles
  elementwise.py, reduce.py, matmul.py, pool.py, scan.py   the families: sample, module, describe, candidates
  world.py     the world: streams per family, splits, materialisation (kernels/tasks.py resolves 'generated')

Pure Python: no torch, no JAX. See kevin_jax/data/README.md.
"""
