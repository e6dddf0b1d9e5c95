import torch
import torch.nn as nn

BATCH = 32765
IN_FEATURES = 2000
OUT_FEATURES = 250


class Model(nn.Module):
    """Linear layer (a classifier head) followed by log-softmax over the classes."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.linear(x), dim=1)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
