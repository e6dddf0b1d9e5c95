import torch
import torch.nn as nn

ROWS = 16381
DIM = 4100
EPS = 1e-6
SCALE = 0.7


class Model(nn.Module):
    """RMS normalisation over the last dimension with a learned weight, a constant scale, plus a residual."""

    def __init__(self, dim: int, eps: float, scale: float):
        super().__init__()
        # Random weight, so that a kernel ignoring it cannot pass.
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)
        self.eps = eps
        self.scale = scale

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        rms = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x * rms * self.weight * self.scale + residual


def get_inputs():
    return [torch.randn(ROWS, DIM), torch.randn(ROWS, DIM)]


def get_init_inputs():
    return [DIM, EPS, SCALE]
