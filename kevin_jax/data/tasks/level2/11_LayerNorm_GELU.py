import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 32767
DIM = 4000
EPS = 1e-5


class Model(nn.Module):
    """LayerNorm over the last dimension followed by GELU (tanh approximation)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=eps)
        # Random affine parameters, so that a kernel ignoring them cannot pass.
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.norm(x), approximate="tanh")


def get_inputs():
    return [torch.randn(ROWS, DIM)]


def get_init_inputs():
    return [DIM, EPS]
