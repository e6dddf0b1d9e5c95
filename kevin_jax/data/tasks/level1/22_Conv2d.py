import torch
import torch.nn as nn

BATCH = 32
IN_CHANNELS = 8
OUT_CHANNELS = 32
HEIGHT = 383
WIDTH = 383
KERNEL_SIZE = 3


class Model(nn.Module):
    """Standard 2-D convolution with few channels: 8 -> 32 channels, 3x3 kernel, no padding, with bias."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE]
