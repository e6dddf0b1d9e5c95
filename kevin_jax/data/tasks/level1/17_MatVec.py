import torch
import torch.nn as nn

M = 163841
K = 4099

# Laplace ("heavy") operands are left out: with them about 1e-5 of the K-term fp32 dot products differ by more than
# 1e-4 between two valid summation orders (e.g. ours and cuBLAS's), so even a correct kernel could fail.
INPUT_DISTRIBUTIONS = ("task", "normal", "uniform", "shifted", "shrunk")


class Model(nn.Module):
    """Matrix-vector product C = A @ B with A of shape (M, K) and B of shape (K, 1)."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.rand(M, K), torch.rand(K, 1)]


def get_init_inputs():
    return []
