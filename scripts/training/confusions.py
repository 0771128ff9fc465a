"""The confusion matrix's picture for a test of more classes than a person can read cell by cell (past run_record.py's
MOST_DRAWN, 30): the most frequent confusions as bars, and the matrix of the classes most mistaken, each row as
shares of its true class. Its size and memory do not grow with the classes, as a matrix drawn cell by cell's do
(docs/measured.md); every count is in confusion_matrix.csv beside it. Loaded by the evaluation report only for such a
test:

    python -m scripts.train test --config configs/table.yaml --ckpt_path outputs/<exp>/<run>/checkpoints/best.ckpt
"""

from __future__ import annotations

import numpy as np

TOP_CONFUSIONS = 20  # bars: the (true, predicted) pairs most often mistaken
MOST_CONFUSED = 30  # rows and columns of the matrix drawn: the classes in the most mistakes, made or suffered


def top_confusions(counts: np.ndarray, most: int = TOP_CONFUSIONS) -> list[tuple[int, int, int]]:
    """(true, predicted, count) of the `most` largest off-diagonal counts, largest first (ties: true, then predicted
    class index); none of 0."""
    wrong = counts.copy()
    np.fill_diagonal(wrong, 0)
    cells = np.flatnonzero(wrong)
    order = cells[np.lexsort((cells, -wrong.flat[cells]))][:most]
    return [(int(cell // len(counts)), int(cell % len(counts)), int(wrong.flat[cell])) for cell in order]


def most_confused(counts: np.ndarray, most: int = MOST_CONFUSED) -> np.ndarray:
    """Indices, in class order, of the `most` classes in the most mistakes (as the true class or the predicted one);
    classes in none are left out."""
    wrong = counts.copy()
    np.fill_diagonal(wrong, 0)
    involved = wrong.sum(axis=0) + wrong.sum(axis=1)
    ranked = np.argsort(-involved, kind="stable")[:most]
    return np.sort(ranked[involved[ranked] > 0])


def many_classes_figure(class_names: list[str], counts: np.ndarray, title: str):
    """Bars of the top confusions (left) and the row-normalised matrix of the most confused classes (right): about
    1,300 x 850 px whatever the number of classes."""
    from matplotlib.figure import Figure

    names = [str(name) for name in class_names]
    figure = Figure(figsize=(16, 9))  # png()'s tight box, not a constrained layout, which peaks higher (measured.md)
    figure.suptitle(f"{title}; {len(names)} classes: the most frequent confusions (every count: confusion_matrix.csv)")
    bars, grid = figure.subplots(1, 2, width_ratios=(2, 3), gridspec_kw={"wspace": 0.35})
    pairs = top_confusions(counts)
    if not pairs:
        for axes in (bars, grid):
            axes.text(0.5, 0.5, "no mistakes", ha="center", va="center")
            axes.axis("off")
        return figure
    support = counts.sum(axis=1)
    labels = [f"{names[true]} -> {names[predicted]}" for true, predicted, _ in pairs]
    bars.barh(range(len(pairs)), [count for _, _, count in pairs], color="tab:blue")
    bars.set_yticks(range(len(pairs)), labels, fontsize=8)
    bars.invert_yaxis()
    for place, (true, _, count) in enumerate(pairs):
        bars.text(count, place, f" {count} ({count / support[true]:.0%} of {names[true]})", va="center", fontsize=7)
    bars.set(xlabel="test items (true -> predicted)", title=f"the {len(pairs)} most frequent confusions")
    shown = most_confused(counts)
    shares = counts[np.ix_(shown, shown)] / np.maximum(support[shown], 1)[:, None]  # of each true class's items
    image = grid.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    figure.colorbar(image, ax=grid, shrink=0.6, label="share of the true class's items")
    ticks, size = range(len(shown)), 8 if len(shown) <= 20 else 6
    grid.set_xticks(ticks, [names[i] for i in shown], rotation=90, fontsize=size)
    grid.set_yticks(ticks, [names[i] for i in shown], fontsize=size)
    for (row, column), share in np.ndenumerate(shares):
        if share >= 0.01:
            colour = "white" if share > 0.5 else "black"
            grid.text(column, row, f"{share * 100:.0f}", ha="center", va="center", color=colour, fontsize=size - 1)
    grid.set(xlabel="predicted class", ylabel="true class",
             title=f"the {len(shown)} classes in the most mistakes: % of each true class")  # fmt: skip
    return figure
