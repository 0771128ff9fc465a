"""The Microsoft Learn course's penguin classifier: 5 features -> 10 -> 10 -> 3, ReLU between."""

from torch import nn


class PenguinNet(nn.Sequential):
    def __init__(self, num_classes: int, num_features: int = 5, hidden: int = 10) -> None:
        super().__init__(
            nn.Linear(num_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )
