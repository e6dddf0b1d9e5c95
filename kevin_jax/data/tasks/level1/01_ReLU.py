import torch
import torch.nn as nn

BATCH = 8191
DIM = 32771


class Model(nn.Module):
    """ReLU activation: y = max(x, 0), elementwise."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


def get_inputs():
    # Normal inputs: half the elements are negative (uniform [0, 1) inputs would make ReLU the identity).
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
