"""Small elementwise task for fast adversarial tests: out = x + y over 4M floats."""
import torch
import torch.nn as nn


class Model(nn.Module):
  def __init__(self):
    super().__init__()

  def forward(self, x, y):
    return x + y


n = 1 << 22


def get_inputs():
  return [torch.randn(n), torch.randn(n)]


def get_init_inputs():
  return []
