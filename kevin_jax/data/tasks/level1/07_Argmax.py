import torch
import torch.nn as nn

BATCH = 255
DIM1 = 2039
DIM2 = 1031


class Model(nn.Module):
    """Index of the maximum over dimension 1 of a 3-D tensor (int64 output)."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.argmax(x, dim=self.dim)


def get_inputs():
    return [torch.randn(BATCH, DIM1, DIM2)]


def get_init_inputs():
    return [1]
