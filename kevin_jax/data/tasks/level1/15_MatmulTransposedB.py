import torch
import torch.nn as nn

M = 3077
K = 2049
N = 4091


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
