"""Linear layer, exact (erf) GELU, then multiplication by a constant: y = gelu(x @ W^T + b) * s."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 2500
IN_FEATURES = 3071
OUT_FEATURES = 2900
SCALING_FACTOR = 1.7


class Model(nn.Module):
  """nn.Linear, GELU (erf form), scaling."""

  def __init__(self, in_features, out_features, scaling_factor):
    super().__init__()
    self.linear = nn.Linear(in_features, out_features)
    self.scaling_factor = scaling_factor

  def forward(self, x):
    return F.gelu(self.linear(x)) * self.scaling_factor


def get_inputs():
  return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
  return [IN_FEATURES, OUT_FEATURES, SCALING_FACTOR]
