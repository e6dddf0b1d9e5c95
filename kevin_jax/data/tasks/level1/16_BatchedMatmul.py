import torch
import torch.nn as nn

BATCH = 61
M = 509
K = 1021
N = 767


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
