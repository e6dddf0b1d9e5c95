"""The kernel evaluator (PyTorch + CuPy world; never imports JAX).

Entry points: `evaluator.Evaluator` / `evaluator.EvaluatorConfig` (batches of candidates), `evaluate` (CLI),
`candidate.parse_candidate`, `plan.parse_plan`, `compile.compile_cuda`, `tasks` (task discovery). Importing the
package or `evaluator` does not import torch or CuPy; only the worker processes do. See README.md here.
"""
