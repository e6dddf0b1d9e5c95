"""Small reduction task (small output) for memoisation tests: out[i] = sum_j x[i, j]."""
import torch
import torch.nn as nn


class Model(nn.Module):
  def __init__(self):
    super().__init__()

  def forward(self, x):
    return torch.sum(x, dim=1)


rows, cols = 4096, 2048


def get_inputs():
  return [torch.randn(rows, cols)]


def get_init_inputs():
  return []
