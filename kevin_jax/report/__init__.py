"""Reports over evaluation results (learner side: no torch, no JAX)."""
