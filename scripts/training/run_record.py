"""The run's record in MLflow besides metrics (its store and run: tracking.py): the resolved config (as config.yaml
beside the checkpoints and in MLflow, and as parameters, once, under the config's dotted names), the metrics not yet
sent in each checkpoint, no record at all of a run that failed before measuring anything, the line a fit stopped by
SIGTERM ends with; and after every test (the end of `fit`, `test`, the pipeline's evaluate step) the evaluation report a
person looks at (`EvaluationReport`): how each class fares, not only `test_acc`. The run gets

- metrics `test_precision/<class>`, `test_recall/<class>`, `test_f1/<class>` and their macro averages
  (`test_f1_macro`, ...: over the classes the test split holds or the network predicted, as torchmetrics averages);
- in its folder beside the checkpoints (outputs/<experiment id>/<run id>/evaluation/; a `test` run's own folder) and
  in its MLflow artifacts (`evaluation/`, what the MLflow UI and Azure ML studio show):
  `confusion_matrix.png` (counts; true classes down, predicted across), `per_class.csv` (class, precision, recall,
  f1, support) and, for images, `most_confident_mistakes.png` (the wrong answers the network was surest of, each
  titled with its true and predicted class and the confidence).

The confusion matrix and the candidate mistakes stay on the device during the test (no step waits for them); under
several processes each evaluates its own share of the test split (datamodules/base.py EvaluationShard), the shares'
matrices are summed and their mistakes pooled, and global rank 0 alone writes and logs. scripts.train's CLI uses this
module for every command:

    python -m scripts.train fit --config configs/penguins.yaml    # a run in outputs/mlflow.db
    python -m scripts.train test --config configs/penguins.yaml --ckpt_path outputs/<exp>/<run>/checkpoints/best.ckpt
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import sys
from functools import partial
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger

from scripts.training.checkpoints import CONFIG_KEY, flatten, keep_run_id, write_whole
from scripts.training.tracking import BufferedMLFlowLogger

# Set by launchers that start the processes themselves (torchrun, Azure ML, mpirun, horovodrun, Lightning's own).
LAUNCHER_VARIABLES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "OMPI_COMM_WORLD_RANK", "HOROVOD_RANK",
)  # fmt: skip
UNSENT_KEY = "unsent_metrics"  # a checkpoint's metrics that the local store did not have yet when it was written


def run_dir(trainer: L.Trainer) -> Path:
    """outputs/<experiment id>/<run id>: where checkpoints go, so a run's files sit together."""
    logger = trainer.logger
    if logger is None:
        return Path(trainer.default_root_dir)
    return Path(trainer.default_root_dir) / str(logger.name) / str(logger.version)


class TrackConfig(SaveConfigCallback):
    """The run's record: the resolved config beside the checkpoints and in MLflow (file and parameters), the metrics
    not sent yet in each checkpoint, and no record at all of a run that failed before measuring anything."""

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "predict":  # no run to file it under: it would overwrite outputs/config.yaml
            return
        # Checked when parsed: checking it again would cost a fifth of a sweep trial's CLI time (docs/measured.md).
        text = self.parser.dump(self.config, skip_unset=False, skip_validation=True)
        self.config_text = text
        path = run_dir(trainer) / "config.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if isinstance(trainer.logger, MLFlowLogger):
            import yaml
            from mlflow.entities import Param

            params = flatten(yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))  # libyaml's: C
            params.pop("config", None)  # the paths of the YAML files: the artifact says it all
            # A resumed run (--checkpoint_dir, a restarted Azure ML job) has its parameters; MLflow refuses changes
            # (a longer max_epochs, say): those are in the config.yaml logged below, which replaces the first one.
            client, run_id = trainer.logger.experiment, trainer.logger.run_id
            logger = trainer.logger
            with logger.store_errors() if isinstance(logger, BufferedMLFlowLogger) else contextlib.nullcontext():
                logged = client.get_run(run_id).data.params
                new = [Param(key, str(value)[:500]) for key, value in params.items() if key not in logged]
                for start in range(0, len(new), 100):  # MLflow's most parameters a request
                    client.log_batch(run_id, params=new[start : start + 100])
                client.log_artifact(run_id, str(path))
            if stage == "fit":
                keep_run_id(trainer, self.config.get("checkpoint_dir"), trainer.logger.run_id)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # The fit's config travels in its checkpoints: a resume compares its own with it (checkpoints.check_resume).
        if stage_config := getattr(self, "config_text", None):
            checkpoint[CONFIG_KEY] = stage_config
        # Called while a checkpoint is made, before it is written: a fit resumed from it has every metric logged so
        # far. The metrics not yet in a local store travel in the checkpoint (a synced sqlite write each epoch would
        # cost more than a small model's epoch); a server is sent them, and waited for, instead. What Lightning logs
        # after an epoch's checkpoints, the epoch's training metrics, travels in them (lightning_modules/classifier.py).
        logger = trainer.logger
        if isinstance(logger, BufferedMLFlowLogger) and logger.sender is None:
            checkpoint[UNSENT_KEY] = logger.unsent()
        elif isinstance(logger, BufferedMLFlowLogger):
            logger.flush(wait=True, stop=lambda: sigterm_received(trainer))

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if isinstance(trainer.logger, BufferedMLFlowLogger) and UNSENT_KEY in checkpoint:
            trainer.logger.resend(checkpoint[UNSENT_KEY])

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if type(exception).__name__ == "SIGTERMException" and trainer.is_global_zero:
            print(resume_line(trainer, self.config.get("checkpoint_dir")), file=sys.stderr)
        # A run that failed before measuring anything leaves no folder (its logger deletes its MLflow run).
        logger = trainer.logger
        if isinstance(logger, BufferedMLFlowLogger) and isinstance(exception, KeyboardInterrupt):
            logger.interrupted = True  # Lightning finalizes the run as failed next
        if not (isinstance(logger, BufferedMLFlowLogger) and trainer.is_global_zero and logger.started):
            return
        if logger.handed_over:  # a resumed run's folder holds its earlier epochs' record
            return
        folder = run_dir(trainer)
        if not logger.measured and not any(folder.glob("checkpoints/*")):
            shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(OSError):  # the experiment's folder, when this was its only run
                folder.parent.rmdir()


def resume_line(trainer: L.Trainer, checkpoint_dir: str | None) -> str:
    """What a fit stopped by SIGTERM says: where its last finished epoch is, and the command that goes on from it."""
    # last.ckpt's callback (checkpoints.py) first: it holds the newest epoch.
    newest = sorted(trainer.checkpoint_callbacks, key=lambda callback: getattr(callback, "filename", None) != "last")
    last = next((c.best_model_path for c in newest if getattr(c, "best_model_path", "")), "")
    if not last:
        return f"stopped by SIGTERM at epoch {trainer.current_epoch}, before any epoch finished: nothing to resume from"
    again = f"--checkpoint_dir {checkpoint_dir} (the same MLflow run)" if checkpoint_dir else f"--ckpt_path {last}"
    return (
        f"stopped by SIGTERM at epoch {trainer.current_epoch}: {last} holds the last finished epoch; the same command "
        f"with {again} goes on from it"
    )


def sigterm_received(trainer: L.Trainer) -> bool:
    """Whether this process got SIGTERM during the trainer's run: Lightning's note, or under several processes
    StopTogether's, whose handler replaces Lightning's (scripts/training/sigterm.py)."""
    return trainer.received_sigterm or any(getattr(callback, "signalled", False) for callback in trainer.callbacks)


def launched() -> bool:
    """Whether a launcher (torchrun, Azure ML, mpirun, horovodrun, Lightning's own) started this process."""
    return any(name in os.environ for name in LAUNCHER_VARIABLES)


def first_process() -> bool:
    """Whether this process is the only one, or global rank 0 as its launcher set it up."""
    if not launched():
        return True
    from strategies.launch_check import launched_first

    return launched_first()


def write_metrics(metrics: dict, path: Path) -> None:
    """The metrics as a JSON object of numbers, written to a temporary name beside `path` and renamed."""
    values = {name: float(value) for name, value in sorted(metrics.items())}
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(values, indent=1) + "\n")
    part.replace(path)
    print(f"wrote metrics: {path}")  # by global rank 0 alone (the CLI's after_fit and after_test)


# ---- the evaluation report of every test ----

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
