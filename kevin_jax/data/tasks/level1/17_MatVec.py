import torch
import torch.nn as nn

M = 16383
K = 16381


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
