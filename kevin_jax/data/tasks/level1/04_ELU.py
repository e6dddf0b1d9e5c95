import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8191
DIM = 32771
ALPHA = 1.3


class Model(nn.Module):
    """ELU activation: y = x if x > 0 else alpha * (exp(x) - 1), elementwise."""

    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.elu(x, alpha=self.alpha)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [ALPHA]
