"""The CNN of Azure Synapse's Horovod MNIST tutorial: two 5x5 convolutions, two linear layers, dropout.

    python -m scripts.train fit --config configs/mnist_tutorial.yaml

Input: normalised (N, 1, 28, 28) images; output: logits (the tutorial's log_softmax is left to
the cross-entropy of `ClassificationModule`).
"""

import torch
import torch.nn.functional as F
from torch import nn


class MNISTNet(nn.Module):
    def __init__(self, num_classes: int = 10, dropout: float = 0.5) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d(dropout)
        self.fc1 = nn.Linear(320, 50)  # 20 channels x 4 x 4 after two conv + pool stages
        self.fc2 = nn.Linear(50, num_classes)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(self.dropout(x))
