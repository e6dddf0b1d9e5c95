import torch
import torch.nn as nn

BATCH = 32
IN_CHANNELS = 48
OUT_CHANNELS = 64
HEIGHT = 127
WIDTH = 127


class Model(nn.Module):
    """3x3 convolution (padding 1, with bias), ReLU, then 2x2 max pooling (stride 2, floor mode)."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(torch.relu(self.conv(x)))


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS]
