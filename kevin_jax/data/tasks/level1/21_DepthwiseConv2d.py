import torch
import torch.nn as nn

BATCH = 16
CHANNELS = 64
HEIGHT = 509
WIDTH = 509
KERNEL_SIZE = 3


class Model(nn.Module):
    """Depthwise 3x3 convolution with bias, stride 1, zero padding 1 (output size = input size)."""

    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [CHANNELS, KERNEL_SIZE]
