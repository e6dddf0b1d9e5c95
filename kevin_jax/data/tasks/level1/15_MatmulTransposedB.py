import torch
import torch.nn as nn

M = 4091
K = 1031
N = 6151

# Laplace ("heavy") operands are left out: with them about 1e-5 of the K-term fp32 dot products differ by more than
# 1e-4 between two valid summation orders (e.g. ours and cuBLAS's), so even a correct kernel could fail.
INPUT_DISTRIBUTIONS = ("task", "normal", "uniform", "shifted", "shrunk")


class Model(nn.Module):
    """Matrix multiplication with a transposed right operand: C = A @ B.T, A (M, K), B (N, K)."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B.T)


def get_inputs():
    return [torch.rand(M, K), torch.rand(N, K)]


def get_init_inputs():
    return []
