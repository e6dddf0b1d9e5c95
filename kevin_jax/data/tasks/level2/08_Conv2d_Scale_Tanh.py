import torch
import torch.nn as nn

BATCH = 12
IN_CHANNELS = 32
OUT_CHANNELS = 64
HEIGHT = 150
WIDTH = 150
KERNEL_SIZE = 5


class Model(nn.Module):
    """5x5 'same' convolution (with bias), a learned per-channel scale, then tanh."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.scale = nn.Parameter(torch.rand(out_channels, 1, 1) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.conv(x) * self.scale)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE]
