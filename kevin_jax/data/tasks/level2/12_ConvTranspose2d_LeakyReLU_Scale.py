import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 48
IN_CHANNELS = 64
OUT_CHANNELS = 48
HEIGHT = 63
WIDTH = 63
NEGATIVE_SLOPE = 0.2
MULTIPLIER = 1.5


class Model(nn.Module):
    """2x upsampling transposed convolution (kernel 4, stride 2, padding 1, with bias), LeakyReLU, scaling."""

    def __init__(self, in_channels: int, out_channels: int, negative_slope: float, multiplier: float):
        super().__init__()
        self.conv_t = nn.ConvTranspose2d(in_channels, out_channels, kernel_size=4, stride=2, padding=1)
        self.negative_slope = negative_slope
        self.multiplier = multiplier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(self.conv_t(x), self.negative_slope) * self.multiplier


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, NEGATIVE_SLOPE, MULTIPLIER]
