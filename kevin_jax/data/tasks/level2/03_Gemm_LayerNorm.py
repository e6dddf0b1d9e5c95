"""Linear layer followed by LayerNorm over the output features (with a non-trivial affine)."""
import torch
import torch.nn as nn

BATCH = 4093
IN_FEATURES = 2500
OUT_FEATURES = 2000
EPS = 1e-5


class Model(nn.Module):
  """nn.Linear then nn.LayerNorm(out_features)."""

  def __init__(self, in_features, out_features, eps):
    super().__init__()
    self.linear = nn.Linear(in_features, out_features)
    self.norm = nn.LayerNorm(out_features, eps=eps)
    with torch.no_grad():  # non-trivial affine so that ignoring it is an error
      self.norm.weight.uniform_(0.5, 1.5)
      self.norm.bias.uniform_(-0.5, 0.5)

  def forward(self, x):
    return self.norm(self.linear(x))


def get_inputs():
  return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
  return [IN_FEATURES, OUT_FEATURES, EPS]
