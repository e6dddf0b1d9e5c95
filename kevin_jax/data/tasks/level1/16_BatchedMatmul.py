import torch
import torch.nn as nn

BATCH = 61
M = 509
K = 1021
N = 767

# Laplace ("heavy") operands are left out: with them about 1e-5 of the K-term fp32 dot products differ by more than
# 1e-4 between two valid summation orders (e.g. ours and cuBLAS's), so even a correct kernel could fail.
INPUT_DISTRIBUTIONS = ("task", "normal", "uniform", "shifted", "shrunk")


class Model(nn.Module):
    """Batched matrix multiplication C[b] = A[b] @ B[b]."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.bmm(A, B)


def get_inputs():
    return [torch.rand(BATCH, M, K), torch.rand(BATCH, K, N)]


def get_init_inputs():
    return []
