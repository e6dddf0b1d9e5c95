import torch
import torch.nn as nn

BATCH = 4093
IN_FEATURES = 2500
OUT_FEATURES = 2000
EPS = 1e-5


class Model(nn.Module):
    """Linear layer followed by LayerNorm over the output features."""

    def __init__(self, in_features: int, out_features: int, eps: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.norm = nn.LayerNorm(out_features, eps=eps)
        # Random affine parameters, so that a kernel ignoring them cannot pass.
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.linear(x))


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES, EPS]
