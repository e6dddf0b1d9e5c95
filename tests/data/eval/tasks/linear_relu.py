"""Linear layer + ReLU: parameters by name (linear.weight, linear.bias) and constructor scalars."""
import torch
import torch.nn as nn


class Model(nn.Module):
  def __init__(self, in_features, out_features, scale=2.0):
    super().__init__()
    self.linear = nn.Linear(in_features, out_features)
    self.scale = scale

  def forward(self, x):
    return torch.relu(self.linear(x)) * self.scale


batch, in_features, out_features = 512, 256, 384


def get_inputs():
  return [torch.randn(batch, in_features)]


def get_init_inputs():
  return [in_features, out_features]
