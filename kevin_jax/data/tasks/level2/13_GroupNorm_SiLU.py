import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 96
CHANNELS = 96
HEIGHT = 124
WIDTH = 124
NUM_GROUPS = 12
EPS = 1e-5


class Model(nn.Module):
    """GroupNorm (8 channels per group, random affine) followed by SiLU."""

    def __init__(self, num_groups: int, num_channels: int, eps: float):
        super().__init__()
        self.norm = nn.GroupNorm(num_groups, num_channels, eps=eps)
        # Random affine parameters, so that a kernel ignoring them cannot pass.
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.norm(x))


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [NUM_GROUPS, CHANNELS, EPS]
