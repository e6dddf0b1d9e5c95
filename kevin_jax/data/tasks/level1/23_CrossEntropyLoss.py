import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 65519
CLASSES = 4097


class Model(nn.Module):
    """Per-sample cross-entropy loss of logits against integer class targets (no reduction)."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(predictions, targets, reduction="none")


def get_inputs():
    return [torch.randn(BATCH, CLASSES), torch.randint(0, CLASSES, (BATCH,))]


def get_init_inputs():
    return []
