"""What a person looks at after every test (the end of `fit`, `test`, the pipeline's evaluate step): how each class
fares, not only `test_acc`. scripts/training/cli.py adds EvaluationReport to every fit that tests and every test;
the run gets

- metrics `test_precision/<class>`, `test_recall/<class>`, `test_f1/<class>` and their macro averages
  (`test_f1_macro`, ...: over the classes the test split holds or the network predicted, as torchmetrics averages);
- in its folder beside the checkpoints (outputs/<experiment id>/<run id>/evaluation/; a `test` run's own folder) and
  in its MLflow artifacts (`evaluation/`, what the MLflow UI and Azure ML studio show):
  `confusion_matrix.png` (counts; true classes down, predicted across), `per_class.csv` (class, precision, recall,
  f1, support) and, for images, `most_confident_mistakes.png` (the wrong answers the network was surest of, each
  titled with its true and predicted class and the confidence).

    python -m scripts.train test --config configs/penguins.yaml --ckpt_path outputs/<exp>/<run>/checkpoints/best.ckpt

The confusion matrix and the candidate mistakes stay on the device during the test (no step waits for them); under
several processes each evaluates its own share of the test split (datamodules/base.py EvaluationShard), the shares'
matrices are summed and their mistakes pooled, and global rank 0 alone writes and logs.
"""

from __future__ import annotations

import csv
import io
import re
from functools import partial
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import MLFlowLogger

from scripts.training.checkpoints import write_whole
from scripts.training.run_record import run_dir
from scripts.training.tracking import BufferedMLFlowLogger

FOLDER = "evaluation"  # in the run's folder and in its MLflow artifacts
MISTAKES = 16  # the most confident mistakes shown
NO_CONFIDENCE = -1.0  # a right answer's, or an empty place's, among the candidate mistakes


class EvaluationReport(L.Callback):
    """Per-class metrics, the confusion matrix and the most confident mistakes of every test (module docstring).

    Args:
        mistakes: how many of the most confident mistakes the image grid shows (0: none).
    """

    def __init__(self, mistakes: int = MISTAKES) -> None:
        self.mistakes = mistakes
        self.matrix: torch.Tensor | None = None  # counts, flattened: true class * classes + predicted class
        # The candidates so far: (confidences, images, true classes, predicted classes), `mistakes` of each.
        self.worst: tuple[torch.Tensor, ...] | None = None
        self.folder: Path | None = None  # where the last test's files went (rank 0)
        self.written: list[Path] = []

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        classes = len(pl_module.class_names)
        self.matrix = torch.zeros(classes * classes, dtype=torch.long, device=pl_module.device)
        self.worst = None
        self.written = []

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        if not isinstance(outputs, torch.Tensor):  # a test_step that gives no logits
            return
        inputs, labels = batch[0], batch[1]
        predicted = outputs.argmax(dim=1)
        # index_put_ rather than bincount: on a GPU bincount waits for the device to size its result.
        cells = labels * len(pl_module.class_names) + predicted
        self.matrix.index_put_((cells,), torch.ones_like(cells), accumulate=True)
        if self.mistakes and inputs.dim() == 4:
            self.keep_mistakes(inputs, labels, outputs)

    def keep_mistakes(self, inputs: torch.Tensor, labels: torch.Tensor, logits: torch.Tensor) -> None:
        """The `mistakes` most confident wrong answers so far, this batch's among them; sizes that do not depend on the
        data, so nothing waits for the device."""
        confidence, predicted = F.softmax(logits.float(), dim=1).max(dim=1)
        confidence = torch.where(predicted == labels, NO_CONFIDENCE, confidence)
        top = confidence.topk(min(self.mistakes, len(confidence))).indices
        candidates = (confidence[top], inputs[top].float(), labels[top], predicted[top])
        if self.worst is not None:
            candidates = tuple(torch.cat(pair) for pair in zip(self.worst, candidates))
        keep = candidates[0].topk(min(self.mistakes, len(candidates[0]))).indices
        self.worst = tuple(values[keep] for values in candidates)

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        classes = len(pl_module.class_names)
        matrix, worst = self.matrix, self.worst
        shape = getattr(pl_module, "input_shape", None)
        images = bool(self.mistakes) and shape is not None and len(shape) == 3
        if trainer.world_size > 1:  # every process takes part, whatever its share held
            matrix = torch.stack(pl_module.gather_from_processes(matrix)).sum(dim=0)
            if images:
                worst = tuple(
                    torch.cat(pl_module.gather_from_processes(values))
                    for values in padded(worst, self.mistakes, shape, pl_module.device)
                )
        matrix = matrix.view(classes, classes).cpu()
        if matrix.sum() == 0:
            return
        scores = per_class_scores(matrix)
        # Every process has the summed matrix: each logs the same averages (Lightning's table, --metrics_file).
        pl_module.log_dict({f"test_{name}_macro": value for name, value in macro_averages(scores, matrix).items()})
        if not trainer.is_global_zero:
            return
        keys = metric_names(pl_module.class_names)
        per_class = {
            f"test_{name}/{key}": scores[name][index].item()
            for name in ("precision", "recall", "f1")
            for index, key in enumerate(keys)
        }
        for logger in trainer.loggers:  # the epoch, as Lightning gives its own epoch metrics
            logger.log_metrics({**per_class, "epoch": trainer.current_epoch}, step=trainer.global_step)
        if images and worst is not None:
            worst = tuple(values.cpu() for values in worst)
            shown = getattr(trainer.datamodule, "images_to_show", None)
            worst = (worst[0], shown(worst[1]) if shown else worst[1], worst[2], worst[3])
        self.folder = run_dir(trainer) / FOLDER
        self.written = write_report(self.folder, pl_module.class_names, matrix, scores, worst if images else None)
        log_artifacts(trainer, self.written)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Here, not as the files are written: the progress bar (a callback before this one) has closed its line.
        if trainer.is_global_zero and self.written:
            print(f"evaluation: {self.folder} ({', '.join(path.name for path in self.written)})")


def padded(worst: tuple[torch.Tensor, ...] | None, size: int, shape: tuple[int, ...], device) -> tuple:
    """The candidates, `size` of each (empty places of NO_CONFIDENCE): every process gathers tensors of one shape."""
    empty = (
        torch.full((size,), NO_CONFIDENCE, device=device),
        torch.zeros((size, *shape), device=device),
        torch.zeros(size, dtype=torch.long, device=device),
        torch.zeros(size, dtype=torch.long, device=device),
    )
    if worst is None:
        return empty
    return tuple(torch.cat([values, blank[len(values) :]]) for values, blank in zip(worst, empty))


def per_class_scores(matrix: torch.Tensor) -> dict[str, torch.Tensor]:
    """Precision, recall, F1 and support of each class from the confusion matrix (rows true, columns predicted); a
    ratio of nothing (a class never predicted, or absent from the split) is 0."""
    matrix = matrix.double()
    right, predicted, support = matrix.diag(), matrix.sum(dim=0), matrix.sum(dim=1)
    precision = torch.where(predicted > 0, right / predicted.clamp_min(1), 0.0)
    recall = torch.where(support > 0, right / support.clamp_min(1), 0.0)
    both = precision + recall
    f1 = torch.where(both > 0, 2 * precision * recall / both.clamp_min(1e-300), 0.0)
    return {"precision": precision, "recall": recall, "f1": f1, "support": support.long()}


def macro_averages(scores: dict[str, torch.Tensor], matrix: torch.Tensor) -> dict[str, float]:
    """The unweighted means over the classes the split holds or the network predicted (as torchmetrics' macro)."""
    seen = (matrix.sum(dim=0) + matrix.sum(dim=1)) > 0
    return {name: scores[name][seen].mean().item() for name in ("precision", "recall", "f1")}


def metric_names(class_names: list[str]) -> list[str]:
    """Each class's name as it can stand in an MLflow metric key after `test_f1/`: letters, digits, `_ - .` and
    spaces (anything else becomes `_`), unique (a name that another already took gets its index)."""
    names: list[str] = []
    for index, name in enumerate(class_names):
        safe = re.sub(r"[^A-Za-z0-9_. -]", "_", str(name)).strip()
        if not safe.strip("."):  # "", "." or "..": a path, to MLflow
            safe = f"class_{index}"
        names.append(f"{safe}_{index}" if safe in names else safe)
    return names


def write_report(
    folder: Path, class_names: list[str], matrix: torch.Tensor, scores: dict, worst: tuple | None
) -> list[Path]:
    """The report's files in `folder`, each written whole (a killed process leaves none half-written); their paths."""
    written = [folder / "per_class.csv", folder / "confusion_matrix.png"]
    table = io.StringIO()
    out = csv.writer(table, lineterminator="\n")
    out.writerow(["class", "precision", "recall", "f1", "support"])
    for index, name in enumerate(class_names):
        row = [f"{scores[key][index].item():.4f}" for key in ("precision", "recall", "f1")]
        out.writerow([name, *row, scores["support"][index].item()])
    write_whole(written[0], table.getvalue().encode())
    write_whole(written[1], png(confusion_figure(class_names, matrix)))
    if worst is not None:
        written.append(folder / "most_confident_mistakes.png")
        write_whole(written[2], png(mistakes_figure(class_names, worst)))
    return written


def png(figure) -> bytes:
    """The figure as PNG bytes, drawn by matplotlib's Agg renderer: the figures here are matplotlib.figure.Figure,
    never pyplot's, so a process that shows figures of its own (a notebook calling cli_main) keeps its backend."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return buffer.getvalue()


def confusion_figure(class_names: list[str], matrix: torch.Tensor):
    """Counts in cells, darker for more; the axes named by class, readable from 2 to some 50 classes."""
    from matplotlib.figure import Figure

    classes = len(class_names)
    side = max(4.0, 1.5 + 0.32 * classes)  # inches: about a third of an inch a class
    figure = Figure(figsize=(side + 1, side))
    axes = figure.add_subplot()
    counts = matrix.numpy()
    axes.imshow(counts, cmap="Blues", vmin=0)
    label_size, count_size = (10, 10) if classes <= 12 else (8, 7) if classes <= 25 else (7, 5)
    ticks = range(classes)
    axes.set_xticks(ticks, [str(name) for name in class_names], rotation=45 if classes <= 12 else 90, ha="right",
                    rotation_mode="anchor", fontsize=label_size)  # fmt: skip
    axes.set_yticks(ticks, [str(name) for name in class_names], fontsize=label_size)
    axes.set_xlabel("predicted class")
    axes.set_ylabel("true class")
    total, right = int(counts.sum()), int(counts.trace())
    axes.set_title(f"test split: {total} items, {right / total:.1%} right")
    dark = counts.max() / 2
    for true in ticks:
        for predicted in ticks:
            count = int(counts[true, predicted])
            colour = "white" if count > dark else "black"
            axes.text(predicted, true, str(count), ha="center", va="center", color=colour, fontsize=count_size)
    return figure


def mistakes_figure(class_names: list[str], worst: tuple):
    """The most confident mistakes, most confident first, four to a row; each titled true / predicted (confidence)."""
    from matplotlib.figure import Figure

    confidences, images, labels, predicted = worst
    wrong = [i for i in confidences.argsort(descending=True).tolist() if confidences[i] > NO_CONFIDENCE]
    if not wrong:
        figure = Figure(figsize=(4, 1))
        figure.text(0.5, 0.5, "no mistakes in the test split", ha="center", va="center")
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


def log_artifacts(trainer: L.Trainer, paths: list[Path]) -> None:
    """The files into the run's MLflow artifacts, `evaluation/`: to a tracking server in line behind the metrics (an
    outage then delays them as it does the metrics, and says so at the end), to a local store at once."""
    for logger in trainer.loggers:
        if not isinstance(logger, MLFlowLogger):
            continue
        client, run_id = logger.experiment, logger.run_id
        sender = getattr(logger, "sender", None)
        for path in paths:
            upload = partial(client.log_artifact, run_id, str(path), FOLDER)
            if sender is not None:
                sender.put(upload, "the evaluation's files")
            elif isinstance(logger, BufferedMLFlowLogger):
                with logger.store_errors():
                    upload()
            else:
                upload()
