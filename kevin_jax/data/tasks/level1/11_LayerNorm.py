import torch
import torch.nn as nn

BATCH = 32
SEQ = 2039
FEATURES = 4099


class Model(nn.Module):
    """Layer normalisation over the last dimension with an elementwise affine transform."""

    def __init__(self, features: int):
        super().__init__()
        self.ln = nn.LayerNorm(features)
        # Random affine parameters, so that a kernel ignoring them cannot pass.
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


def get_inputs():
    return [torch.randn(BATCH, SEQ, FEATURES)]


def get_init_inputs():
    return [FEATURES]
