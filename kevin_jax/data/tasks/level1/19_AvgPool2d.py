import torch
import torch.nn as nn

BATCH = 16
CHANNELS = 64
HEIGHT = 509
WIDTH = 509
KERNEL_SIZE = 3
STRIDE = 1
PADDING = 1


class Model(nn.Module):
    """2-D average pooling, 3x3 window, stride 1, zero padding 1 counted in the average."""

    def __init__(self, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.pool = nn.AvgPool2d(kernel_size=kernel_size, stride=stride, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [KERNEL_SIZE, STRIDE, PADDING]
