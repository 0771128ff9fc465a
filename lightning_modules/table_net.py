"""A multilayer perceptron for tables whose first layer takes the width the data gives: the table datamodule
(datamodules/table.py) feeds it one batch of the table's width before training, so no config states that width and
none can contradict it.

    python -m scripts.train fit --config configs/table.yaml --model.network.init_args.hidden 128
"""

from torch import nn


class TableNet(nn.Sequential):
    """`layers` hidden layers of `hidden` units (ReLU, dropout `dropout`), then one logit per class."""

    def __init__(self, num_classes: int, hidden: int = 64, layers: int = 2, dropout: float = 0.0) -> None:
        blocks: list[nn.Module] = [nn.LazyLinear(hidden), nn.ReLU(), nn.Dropout(dropout)]
        for _ in range(layers - 1):
            blocks += [nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout)]
        super().__init__(*blocks, nn.Linear(hidden, num_classes))
