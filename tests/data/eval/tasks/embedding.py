"""Embedding lookup: an int64 index input and a parameter table (emb.weight)."""
import torch
import torch.nn as nn


class Model(nn.Module):
  def __init__(self, num_embeddings, dim):
    super().__init__()
    self.emb = nn.Embedding(num_embeddings, dim)

  def forward(self, idx):
    return self.emb(idx)


num_embeddings, dim, n = 1000, 128, 8192


def get_inputs():
  return [torch.randint(0, num_embeddings, (n,))]


def get_init_inputs():
  return [num_embeddings, dim]
