import torch
import torch.nn as nn

BATCH = 8191
IN_FEATURES = 1000
OUT_FEATURES = 2047


class Model(nn.Module):
    """Linear layer, sigmoid, then a sum over the features: y = sigmoid(x @ W^T + b).sum(1, keepdim=True)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.linear(x)).sum(dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
