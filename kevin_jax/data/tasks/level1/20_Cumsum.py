import torch
import torch.nn as nn

BATCH = 32771
DIM = 8191

# Prefix sums of zero-mean inputs cross zero again and again; there PyTorch's own fp32 scan differs from the exact
# result by more than atol = 1e-4, so only positive-mean inputs (as KernelBench uses) are checked.
INPUT_DISTRIBUTIONS = ("task", "shifted", "shrunk")


class Model(nn.Module):
    """Inclusive cumulative sum along dimension 1."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=self.dim)


def get_inputs():
    return [torch.rand(BATCH, DIM)]


def get_init_inputs():
    return [1]
