"""The evaluation report's part for images: a test's most confident mistakes, kept on the device while it runs (sizes
that do not depend on the data, so no step waits for them), pooled over the processes and drawn as
most_confident_mistakes.png (run_record.py EvaluationReport). Loaded only when a test's inputs are images.

    python -m scripts.train test --config configs/mnist.yaml --ckpt_path outputs/<exp>/<run>/checkpoints/best.ckpt
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SHOWN = 16  # the most confident mistakes shown
NO_CONFIDENCE = -1.0  # a right answer's, or an empty place's, among the candidates

# The candidates: (confidences, images, true classes, predicted classes), at most `size` of each.
Worst = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def keep_mistakes(worst: Worst | None, inputs: torch.Tensor, labels: torch.Tensor, logits: torch.Tensor,
                  size: int = SHOWN) -> Worst:  # fmt: skip
    """The `size` most confident wrong answers of `worst` and this batch's."""
    confidence, predicted = F.softmax(logits.float(), dim=1).max(dim=1)
    confidence = torch.where(predicted == labels, NO_CONFIDENCE, confidence)
    top = confidence.topk(min(size, len(confidence))).indices
    candidates = (confidence[top], inputs[top].float(), labels[top], predicted[top])
    if worst is not None:
        candidates = tuple(torch.cat(pair) for pair in zip(worst, candidates))
    keep = candidates[0].topk(min(size, len(candidates[0]))).indices
    return tuple(values[keep] for values in candidates)


def pooled(worst: Worst | None, shape: tuple[int, ...], trainer, pl_module, size: int = SHOWN) -> Worst | None:
    """The candidates of every process (a collective: each calls it) for global rank 0 to show (`to_show`)."""
    if trainer.world_size > 1:
        worst = gathered(worst, size, shape, pl_module)
    return to_show(worst, trainer.datamodule) if worst is not None and trainer.is_global_zero else worst


def gathered(worst: Worst | None, size: int, shape: tuple[int, ...], pl_module) -> Worst:
    """Every process's candidates, each padded to `size` (empty places of NO_CONFIDENCE): all gather one shape."""
    device = pl_module.device
    empty = (
        torch.full((size,), NO_CONFIDENCE, device=device),
        torch.zeros((size, *shape), device=device),
        torch.zeros(size, dtype=torch.long, device=device),
        torch.zeros(size, dtype=torch.long, device=device),
    )
    padded = empty if worst is None else [torch.cat([mine, blank[len(mine) :]]) for mine, blank in zip(worst, empty)]
    return tuple(torch.cat(pl_module.gather_from_processes(values)) for values in padded)


def to_show(worst: Worst, datamodule) -> Worst:
    """The candidates on the CPU, their images in [0, 1] for a person: the datamodule's `images_to_show` undoes its
    normalisation; without one, each image's values are stretched over [0, 1]."""
    confidences, images, labels, predicted = (values.cpu() for values in worst)
    if shown := getattr(datamodule, "images_to_show", None):
        images = shown(images)
    else:
        low, high = images.amin(dim=(1, 2, 3), keepdim=True), images.amax(dim=(1, 2, 3), keepdim=True)
        images = (images - low) / (high - low).clamp_min(1e-12)
    return confidences, images, labels, predicted


def mistakes_figure(class_names: list[str], worst: Worst, split: str = "test split"):
    """The most confident mistakes, most confident first, four to a row; each titled true / predicted (confidence)."""
    from matplotlib.figure import Figure

    confidences, images, labels, predicted = worst
    wrong = [i for i in confidences.argsort(descending=True).tolist() if confidences[i] > NO_CONFIDENCE]
    if not wrong:
        figure = Figure(figsize=(4, 1))
        figure.text(0.5, 0.5, f"no mistakes in the {split}", ha="center", va="center")
        return figure
    columns = min(4, len(wrong))
    rows = -(-len(wrong) // columns)
    figure = Figure(figsize=(3 * columns, 3.3 * rows))
    for place, index in enumerate(wrong):
        axes = figure.add_subplot(rows, columns, place + 1)
        image = images[index].permute(1, 2, 0).clamp(0, 1).numpy()
        if image.shape[2] == 1:
            axes.imshow(image[:, :, 0], cmap="gray", vmin=0, vmax=1)
        else:
            axes.imshow(image)
        true, guess = class_names[labels[index]], class_names[predicted[index]]
        axes.set_title(f"true: {true}\npredicted: {guess} ({confidences[index]:.2f})", fontsize=9)
        axes.axis("off")
    return figure
