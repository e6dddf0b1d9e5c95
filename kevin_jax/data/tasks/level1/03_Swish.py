import torch
import torch.nn as nn

BATCH = 4093
DIM = 32771


class Model(nn.Module):
    """Swish (SiLU) activation written as x * sigmoid(x), elementwise."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
