import torch
import torch.nn as nn

BATCH = 31
FEATURES = 96
GROUPS = 8
HEIGHT = 263
WIDTH = 263


class Model(nn.Module):
    """Group normalisation (8 groups of 12 channels) with an elementwise affine transform."""

    def __init__(self, num_groups: int, num_features: int):
        super().__init__()
        self.gn = nn.GroupNorm(num_groups=num_groups, num_channels=num_features)
        # Random affine parameters, so that a kernel ignoring them cannot pass.
        with torch.no_grad():
            self.gn.weight.uniform_(0.5, 1.5)
            self.gn.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gn(x)


def get_inputs():
    return [torch.randn(BATCH, FEATURES, HEIGHT, WIDTH)]


def get_init_inputs():
    return [GROUPS, FEATURES]
