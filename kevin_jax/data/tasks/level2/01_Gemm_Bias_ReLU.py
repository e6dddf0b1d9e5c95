import torch
import torch.nn as nn

BATCH = 4001
IN_FEATURES = 2047
OUT_FEATURES = 3001


class Model(nn.Module):
    """Linear layer (GEMM + bias) followed by ReLU: y = relu(x @ W^T + b)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
