import torch
import torch.nn as nn

BATCH = 127
DIM1 = 4099
DIM2 = 1279


class Model(nn.Module):
    """Sum reduction over dimension 1 of a 3-D tensor, keeping the reduced dimension."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim, keepdim=True)


def get_inputs():
    return [torch.randn(BATCH, DIM1, DIM2)]


def get_init_inputs():
    return [1]
