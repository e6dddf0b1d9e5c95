import torch
import torch.nn as nn

BATCH = 128
CHANNELS = 64
HEIGHT = 120
WIDTH = 120
CLAMP_MIN = -0.5
CLAMP_MAX = 1.5


class Model(nn.Module):
    """Elementwise chain: swish (x * sigmoid(x)), plus a per-channel bias, then clamp."""

    def __init__(self, channels: int, clamp_min: float, clamp_max: float):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(channels, 1, 1) * 0.5)
        self.clamp_min = clamp_min
        self.clamp_max = clamp_max

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * torch.sigmoid(x)
        x = x + self.bias
        return torch.clamp(x, self.clamp_min, self.clamp_max)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [CHANNELS, CLAMP_MIN, CLAMP_MAX]
