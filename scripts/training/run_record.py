"""The run's record besides its metrics: the resolved config (config.yaml and the run's parameters), the data it saw
(each split as an MLflow dataset input: `log_datasets`), the metrics not yet sent in each checkpoint; and after every
test the evaluation report (`EvaluationReport`: per-class scores, the confusion matrix and, for images, the most
confident mistakes: docs/tracking.md, "What a test adds").

    python -m scripts.train test --config configs/penguins.yaml --ckpt_path outputs/<exp>/<run>/checkpoints/best.ckpt
"""

from __future__ import annotations

import contextlib
import csv
import importlib
import io
import json
import os
import re
import sys
from functools import partial
from pathlib import Path

import lightning as L
import numpy as np
import torch
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger

from scripts.training.checkpoints import CONFIG_KEY, flatten, run_dir, write_whole
from scripts.training.tracking import BufferedMLFlowLogger

LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "OMPI_COMM_WORLD_RANK",
                      "HOROVOD_RANK")  # set by the launchers that start processes themselves  # fmt: skip
UNSENT_KEY = "unsent_metrics"  # a checkpoint's metrics that the local store did not have yet when it was written


class TrackConfig(SaveConfigCallback):
    """The resolved config beside the checkpoints and in MLflow, the metrics not sent yet in each checkpoint; the
    held logger's run at the first batch (a start refused before leaves none: docs/tracking.md)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        logger = trainer.logger
        held = isinstance(logger, BufferedMLFlowLogger) and logger.held
        if trainer.world_size > 1:  # global rank 0's answer: a resumed run's id may be on its node's disk alone
            held = trainer.strategy.broadcast(held, src=0)
            if isinstance(logger, BufferedMLFlowLogger):
                logger.held = held
        if held:  # every process waits for the run's folder at the first batch (start_record), or none does
            self.waiting = [callback for callback in trainer.checkpoint_callbacks if callback.dirpath is None]  # run's
        else:
            super().setup(trainer, pl_module, stage)

    def start_record(self, trainer: L.Trainer, pl_module: L.LightningModule, *batch) -> None:
        """Creates the held run (global rank 0), puts the checkpoints in its folder, records the config."""
        if getattr(self, "waiting", None) is None or trainer.sanity_checking:
            return
        trainer.logger.held = False
        folder = Path(trainer.strategy.broadcast(str(run_dir(trainer)) if trainer.is_global_zero else None))
        for callback in self.waiting:  # where ModelCheckpoint puts them, had the run existed at its setup
            callback.dirpath = str(folder / "checkpoints")
        self.waiting = None
        super().setup(trainer, pl_module, trainer.state.fn)
        if pending := getattr(self, "datasets_pending", None):  # the splits' datasets, now that the run is there
            self.datasets_pending = None
            log_datasets(trainer, pending)

    on_train_batch_start = on_validation_batch_start = on_test_batch_start = start_record  # its first batch read

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "predict":  # no run to file it under: it would overwrite outputs/config.yaml
            return
        # Checked when parsed: checking it again would cost a fifth of a sweep trial's CLI time (docs/measured.md).
        self.config_text = text = self.parser.dump(self.config, skip_unset=False, skip_validation=True)
        path = run_dir(trainer) / "config.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)  # in place: a resumed run's, on a full disk, still fits
        if isinstance(trainer.logger, MLFlowLogger):
            import yaml
            from mlflow.entities import Param

            params = flatten(yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))  # libyaml's: C
            params.pop("config", None)  # the paths of the YAML files: the artifact says it all
            # A resumed run has its parameters (MLflow refuses changes): the config.yaml below says what changed.
            logger, client, run_id = trainer.logger, trainer.logger.experiment, trainer.logger.run_id
            with logger.store_errors() if isinstance(logger, BufferedMLFlowLogger) else contextlib.nullcontext():
                logged = client.get_run(run_id).data.params
                new = [Param(key, str(value)[:500]) for key, value in params.items() if key not in logged]
                for start in range(0, len(new), 100):  # MLflow's most parameters a request
                    client.log_batch(run_id, params=new[start : start + 100])
                client.log_artifact(run_id, str(path))
                # Each column's kind as the data was read (a table's: datamodules/table.py), once per fit.
                record = getattr(trainer.datamodule, "columns_record", None)
                if stage == "fit" and record is not None and (columns := record()):
                    client.log_dict(run_id, columns, "columns.json")
            if stage == "fit" and self.config.get("checkpoint_dir"):
                from scripts.training.resume import keep_run_id

                keep_run_id(trainer, self.config.checkpoint_dir, trainer.logger.run_id)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if stage_config := getattr(self, "config_text", None):  # what a resume compares its config with (resume.py)
            checkpoint[CONFIG_KEY] = stage_config
        # Before the checkpoint is written: the metrics not yet in a local store travel in it (a synced sqlite write
        # each epoch would cost more than a small model's epoch); a server is sent them, and waited for, instead.
        logger = trainer.logger
        if isinstance(logger, BufferedMLFlowLogger) and logger.sender is None:
            checkpoint[UNSENT_KEY] = logger.unsent()
        elif isinstance(logger, BufferedMLFlowLogger):  # not once SIGTERM came (Lightning's note, or StopTogether's)
            signalled = [callback for callback in trainer.callbacks if hasattr(callback, "signalled")]
            logger.flush(wait=True, stop=lambda: trainer.received_sigterm or any(c.signalled for c in signalled))

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.log_datasets(trainer, ("train", "val"))  # not at setup: a checkpoint's split rule is restored by now

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.log_datasets(trainer, ("test",))

    def log_datasets(self, trainer: L.Trainer, splits: tuple[str, ...]) -> None:
        """Now, or once the held run is created at the first batch (start_record)."""
        if getattr(self, "waiting", None) is not None:
            self.datasets_pending = splits
        else:
            log_datasets(trainer, splits)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # A resumed fit's (a test of this run's checkpoint would send them again, which the store keeps once).
        fit = trainer.state.fn == "fit" and trainer.is_global_zero  # in the logger's process (resume.py)
        if isinstance(trainer.logger, BufferedMLFlowLogger) and UNSENT_KEY in checkpoint and fit:
            importlib.import_module("scripts.training.resume").resend(trainer.logger, checkpoint[UNSENT_KEY])

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        from scripts.training.failed_runs import after_exception

        logger = trainer.logger if isinstance(trainer.logger, BufferedMLFlowLogger) else None
        after_exception(trainer, exception, self.config.get("checkpoint_dir"), logger)


def log_datasets(trainer: L.Trainer, splits: tuple[str, ...]) -> None:
    """Global rank 0 logs each of `splits` as a dataset input of the run from the datamodule's `identity`
    (datamodules/base.py). A store that lacks the route gets one line on stderr; the run goes on."""
    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.exceptions import MlflowException
    from mlflow.types.schema import ColSpec, Schema
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    identity, logger = getattr(trainer.datamodule, "identity", None), trainer.logger
    if not identity or not trainer.is_global_zero or not isinstance(logger, MLFlowLogger):
        return
    source = CodeDatasetSource({"source": identity["source"], "digest": identity["digest"]})
    types = {"numeric": "double", "categorical": "string", "label": "string", "image": "binary"}  # others: not read
    kinds = {name: kind.partition(" ")[0].rstrip(":") for name, kind in identity["schema"].items()}  # "image 3x64x64"
    schema = Schema([ColSpec(types.get(kind, "string"), str(name), required=kind in types)
                     for name, kind in kinds.items()])  # fmt: skip
    inputs = []
    for split in splits:  # each split a dataset of its own digest; the run's inputs show which it was
        meta = MetaDataset(source, Path(identity["source"]).name, identity["splits"][split]["digest"], schema)
        profile = json.dumps({**identity["splits"][split], "split": identity["split"]})  # a test's "source" too
        context = {"train": "training", "val": "validation"}.get(split, split)
        inputs.append(
            DatasetInput(Dataset(**meta.to_dict(), profile=profile), [InputTag(MLFLOW_DATASET_CONTEXT, context)])
        )

    def send() -> None:
        if getattr(logger, "inputs_refused", False):  # said once: a fit's test would say it again
            return
        try:
            logger.experiment.log_inputs(logger.run_id, datasets=inputs)
        except MlflowException as error:
            if not 400 <= error.get_http_status_code() < 500:  # down or failing: the Sender tries it again
                raise
            logger.inputs_refused = True  # a store without the route: the run's metrics and model matter more
            print(f"note: the tracking store did not take the run's datasets ({str(error).strip().splitlines()[0]}); "
                  "its checkpoints keep their digests", file=sys.stderr)  # fmt: skip

    if isinstance(logger, BufferedMLFlowLogger):  # to a server: in line behind the metrics, never waited for
        logger.send(send, "the run's datasets")
    else:
        send()


def launched() -> bool:
    return any(name in os.environ for name in LAUNCHER_VARIABLES)


def first_process() -> bool:  # global rank 0 as its launcher set it up (strategies/launch_check.py), or no launcher
    return not launched() or importlib.import_module("strategies.launch_check").launched_first()


FOLDER = "evaluation"  # in the run's folder and in its MLflow artifacts
MOST_DRAWN = 30  # classes whose every count the confusion matrix's picture shows


class EvaluationReport(L.Callback):
    """The matrix and the candidate mistakes stay on the device (no step waits for them); global rank 0 writes and
    logs the report, pooled over the processes."""

    def __init__(self) -> None:
        self.matrix: torch.Tensor | None = None  # counts, flattened: true class * classes + predicted class
        self.worst: tuple[torch.Tensor, ...] | None = None  # the candidate mistakes (mistakes.py)
        self.folder: Path | None = None  # where the last test's files went (rank 0)
        self.written: list[Path] = []

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        classes = len(pl_module.class_names)
        self.matrix = torch.zeros(classes * classes, dtype=torch.long, device=pl_module.device)
        self.worst, self.written, self.absent = None, [], []  # absent: the classes the split holds no item of

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int, dataloader_idx: int = 0) -> None:
        if not isinstance(outputs, torch.Tensor):  # a test_step that gives no logits
            return
        inputs, labels = batch[0], batch[1]
        # index_put_ rather than bincount: on a GPU bincount waits for the device to size its result.
        cells = labels * len(pl_module.class_names) + outputs.argmax(dim=1)
        self.matrix.index_put_((cells,), torch.ones_like(cells), accumulate=True)
        if inputs.dim() == 4:  # images
            from scripts.training.mistakes import keep_mistakes

            self.worst = keep_mistakes(self.worst, inputs, labels, outputs)

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        classes, matrix, worst = len(pl_module.class_names), self.matrix, None
        if trainer.world_size > 1:  # every process takes part, whatever its share held
            matrix = torch.stack(pl_module.gather_from_processes(matrix)).sum(dim=0)
        shape = getattr(pl_module, "input_shape", None)
        if shape is not None and len(shape) == 3:  # images
            from scripts.training.mistakes import pooled

            worst = pooled(self.worst, shape, trainer, pl_module)
        matrix = matrix.view(classes, classes).cpu()
        if matrix.sum() == 0:
            return
        scores = per_class_scores(matrix)
        # 0 / 0 is n/a, not 0: recall and F1 of a class the split lacks, its precision if never predicted either. Each
        # process logs the same macro averages (Lightning's table, --metrics_file), as torchmetrics': over those seen.
        held, seen = scores["support"] > 0, (matrix.sum(dim=0) + matrix.sum(dim=1)) > 0
        known = {"precision": seen, "recall": held, "f1": held}
        pl_module.log_dict({f"test_{name}_macro": scores[name][seen].mean().item() for name in known})
        if not trainer.is_global_zero:
            return
        keys = list(enumerate(metric_names(pl_module.class_names)))
        per_class = {f"test_{m}/{key}": scores[m][i].item() for m in known for i, key in keys if known[m][i]}
        for logger in trainer.loggers:  # the epoch, as Lightning gives its own epoch metrics
            logger.log_metrics({**per_class, "epoch": trainer.current_epoch}, step=trainer.global_step)
        self.split = "validation split" if getattr(trainer.datamodule, "tests_on_validation", False) else "test split"
        self.folder = run_dir(trainer) / FOLDER
        self.written = write_report(self.folder, pl_module.class_names, matrix, scores, known, worst, self.split)
        for mlflow in (logger for logger in trainer.loggers if isinstance(logger, MLFlowLogger)):
            for path in self.written:  # into the run's artifacts `evaluation/`, in line behind the metrics
                upload = partial(mlflow.experiment.log_artifact, mlflow.run_id, str(path), FOLDER)
                if isinstance(mlflow, BufferedMLFlowLogger):
                    mlflow.send(upload, "the evaluation's files")
                else:
                    upload()
        self.absent = [name for name, has in zip(pl_module.class_names, held.tolist()) if not has]

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero and self.written:  # here, not as written: the progress bar has closed its line
            print(f"evaluation: {self.folder} ({', '.join(path.name for path in self.written)})")
            if absent := self.absent:
                names = ", ".join(absent[:5]) + f" and {len(absent) - 5} more" * (len(absent) > 5)
                print(f"evaluation: {names}: none in the {self.split}; n/a in per_class.csv (not 0), no metric logged")


def per_class_scores(matrix: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each class's precision, recall, F1 and support (`matrix`: rows true, columns predicted); 0 for 0 / 0."""
    matrix = matrix.double()
    right, predicted, support = matrix.diag(), matrix.sum(dim=0), matrix.sum(dim=1)
    precision, recall = right / predicted.clamp_min(1), right / support.clamp_min(1)  # right is 0 where either is
    f1 = 2 * right / (predicted + support).clamp_min(1)  # 2PR / (P + R)
    return {"precision": precision, "recall": recall, "f1": f1, "support": support.long()}


def metric_names(class_names: list[str]) -> list[str]:
    """Each class's name as it can stand in an MLflow metric key after `test_f1/`: letters, digits, `_ - .` and
    spaces (anything else becomes `_`), unique (a name that another already took gets its index)."""
    names: list[str] = []
    for index, name in enumerate(class_names):
        safe = re.sub(r"[^A-Za-z0-9_. -]", "_", str(name)).strip()
        safe = safe if safe.strip(".") else f"class_{index}"  # "", "." or "..": a path, to MLflow
        names.append(f"{safe}_{index}" if safe in names else safe)
    return names


def write_report(folder: Path, class_names: list[str], matrix: torch.Tensor, scores: dict, known: dict,
                 worst: tuple | None, split: str = "test split") -> list[Path]:  # fmt: skip
    """The report's files in `folder`, each written whole (a killed process leaves none half-written); their paths.
    `known`: by score, whether each class has one (else n/a). confusion_matrix.csv has every count, drawn or not."""
    written = [folder / "per_class.csv", folder / "confusion_matrix.csv", folder / "confusion_matrix.png"]
    rows = [[f"{scores[m][i].item():.4f}" if known[m][i] else "n/a" for m in known] for i in range(len(class_names))]
    support = scores["support"].tolist()
    per_class = [["class", *known, "support"], *([n, *row, s] for n, row, s in zip(class_names, rows, support))]
    counts = [["true \\ predicted", *class_names], *([n, *row] for n, row in zip(class_names, matrix.tolist()))]
    for path, table in zip(written, (per_class, counts)):
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(table)
        write_whole(path, text.getvalue().encode())
    write_whole(written[2], png(confusion_figure(class_names, matrix, split)))
    if worst is not None:
        from scripts.training.mistakes import mistakes_figure

        written.append(folder / "most_confident_mistakes.png")
        write_whole(written[3], png(mistakes_figure(class_names, worst, split)))
    return written


def png(figure) -> bytes:
    """A matplotlib Figure, never pyplot's (a notebook calling cli_main keeps its backend), as PNG bytes."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    return buffer.getvalue()


def confusion_figure(class_names: list[str], matrix: torch.Tensor, split: str = "test split"):
    """Counts in cells, darker for more, the axes named by class; past MOST_DRAWN classes, confusions.py's picture."""
    from matplotlib.figure import Figure

    classes, counts = len(class_names), matrix.numpy()
    title = f"{split}: {counts.sum()} items, {counts.trace() / counts.sum():.1%} right"
    if classes > MOST_DRAWN:
        from scripts.training.confusions import many_classes_figure

        return many_classes_figure(class_names, counts, title)
    side = max(4.0, 1.5 + 0.32 * classes)  # inches: about a third of an inch a class
    figure = Figure(figsize=(side + 1, side))
    axes = figure.add_subplot()
    axes.imshow(counts, cmap="Blues", vmin=0)
    label_size, count_size = (10, 10) if classes <= 12 else (8, 7) if classes <= 25 else (7, 5)
    ticks = range(classes)
    axes.set_xticks(ticks, [str(name) for name in class_names], rotation=45 if classes <= 12 else 90, ha="right",
                    rotation_mode="anchor", fontsize=label_size)  # fmt: skip
    rows = [f"{name} (no items)" if not held else str(name) for name, held in zip(class_names, counts.sum(axis=1))]
    axes.set_yticks(ticks, rows, fontsize=label_size)
    axes.set(xlabel="predicted class", ylabel="true class", title=title)
    dark = counts.max() / 2
    for (true, predicted), count in np.ndenumerate(counts):
        colour = "white" if count > dark else "black"
        axes.text(predicted, true, str(int(count)), ha="center", va="center", color=colour, fontsize=count_size)
    return figure
