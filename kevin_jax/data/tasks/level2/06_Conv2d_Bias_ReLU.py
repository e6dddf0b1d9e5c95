import torch
import torch.nn as nn

BATCH = 24
IN_CHANNELS = 32
OUT_CHANNELS = 64
HEIGHT = 190
WIDTH = 190
KERNEL_SIZE = 3


class Model(nn.Module):
    """3x3 convolution (no padding, no conv bias), plus a per-channel bias parameter, then ReLU."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, bias=False)
        self.bias = nn.Parameter(torch.randn(out_channels, 1, 1) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x) + self.bias)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE]
