"""The LightningModule every task shares: tasks differ only in the network (a plain `nn.Module` built as
`network(num_classes)`) and the data; cross-entropy, accuracy, throughput, the injected optimizer and its learning-rate
schedule (or schedules.py's warm-up and decay), and prediction live here once.

    python -m scripts.train fit --config configs/penguins.yaml --model.optimizer.lr 0.01
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.nn.parameter import is_lazy
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy


class OptimizerError(ValueError):
    """The configured optimizer refused its arguments, or LightningCLI's own optimizer options were given."""


def refuse_lightning_optimizer_options(words: list[str]) -> None:
    """LightningCLI's own --optimizer and --lr_scheduler would replace configure_optimizers (model.optimizer: not)."""
    for word in words if isinstance(words, list | tuple) else ():
        option = str(word).split("=", 1)[0].split(".", 1)[0]
        if option in ("--optimizer", "--lr_scheduler"):
            raise OptimizerError(
                f"{option}: LightningCLI's own option would replace the module's configure_optimizers (its warm-up, "
                f"decay and lr scaling); give --model.{option[2:]} instead, with the same class path and init_args"
            )


class InputShapeError(ValueError):
    """The data's inputs do not fit the network."""


class DivergedError(ArithmeticError):
    """The training loss or the weights turned non-finite."""


def weights_fit(code: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]) -> bool:
    """Whether state dict `saved` loads strictly into one shaped as `code` (a lazy layer's weights take any shape)."""
    return code.keys() == saved.keys() and all(is_lazy(t) or saved[key].shape == t.shape for key, t in code.items())


class ClassificationModule(L.LightningModule):
    """
    Args:
        network: builds the net given the number of classes (configs name its class and every other argument).
        class_names: label names in index order; linked from the datamodule by the CLI.
        optimizer: any torch optimizer, e.g. `{class_path: torch.optim.SGD, init_args: {lr: 0.03}}`.
        lr_scheduler: an epoch-wise torch scheduler, in place of the warm-up/decay (not chained: give it with
            warmup_steps 0 and poly_decay_power 0).
        warmup_steps: optimizer steps of linear warm-up from 0 to the full lr.
        poly_decay_power: after warm-up, lr *= (1 - progress)^power; 0 keeps it constant.
        scale_lr_by_world_size: multiply the lr by the number of processes (each step sees world_size times more
            samples; Horovod's rule).
        channels_last: the network's 4-D weights and image batches in channels-last order (NHWC), what GPU tensor
            cores run convolutions in; use with bf16 on GPUs.
    """

    def __init__(
        self,
        network: Callable[[int], nn.Module],
        class_names: list[str],
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: LRSchedulerCallable | None = None,
        warmup_steps: int = 0,
        poly_decay_power: float = 0.0,
        scale_lr_by_world_size: bool = False,
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        if lr_scheduler is not None and (warmup_steps or poly_decay_power):
            raise OptimizerError(
                f"model.lr_scheduler replaces the module's own schedule, which is set (warmup_steps {warmup_steps}, "
                f"poly_decay_power {poly_decay_power}); give --model.warmup_steps 0 --model.poly_decay_power 0 with "
                "it, or leave model.lr_scheduler out"
            )
        self.save_hyperparameters()  # the config's class paths too: load_from_checkpoint needs no YAML
        self.class_names = list(class_names)
        self.network = network(len(self.class_names))
        if channels_last:
            self.network.to(memory_format=torch.channels_last)  # moves to the GPU keep this order
        self.optimizer_factory = optimizer
        self.scheduler_factory = lr_scheduler
        # Synced through the Trainer's strategy (DDP's and Horovod's alike), not torchmetrics' own torch.distributed.
        sync = {"dist_sync_fn": self.gather_from_processes, "distributed_available_fn": self.distributed}
        self.metrics = nn.ModuleDict()  # keyed by the names they are logged under
        for split in ("train", "val", "test"):
            # A NaN loss stays in the mean (replaced by NaN), so a diverged epoch shows as one (check_finite);
            # nan_strategy="disable" would also drop the batch-size weights (torchmetrics 1.9).
            self.metrics[f"{split}_loss"] = MeanMetric(nan_strategy=float("nan"), **sync)
            self.metrics[f"{split}_acc"] = MulticlassAccuracy(len(self.class_names), average="micro", **sync)
        self.train_epoch_metrics: dict | None = None  # the newest epoch's, with its epoch and step
        self.samples = 0  # trained on this epoch by this process
        self.epoch_started = self.epoch_seconds = 0.0  # train_samples_per_sec's clock: epoch start to last batch
        self.input_shape: tuple[int, ...] | None = None  # in checkpoints: export needs no data

    def setup(self, stage: str) -> None:
        if stage == "fit" and any(isinstance(p, nn.parameter.UninitializedParameter) for p in self.parameters()):
            # A lazy layer (TableNet's first) takes the inputs' width from one batch, before the optimizer or DDP sees
            # its weights: no config states that width, so none can contradict it.
            inputs = next(iter(self.trainer.datamodule.train_dataloader()))[0][:2]
            with torch.no_grad():
                self.network.eval()(inputs)
            self.network.train()
        if self.hparams.channels_last and self.trainer.strategy.root_device.type == "cuda":
            for parameter in self.network.parameters():
                # One input channel (MNIST's first convolution): its gradient gets the default strides, and DDP warns of
                # the bucket's. Not on a CPU: a slower convolution there (docs/measured.md).
                if parameter.dim() == 4 and parameter.shape[1] == 1:
                    parameter.data = parameter.data.clone(memory_format=torch.contiguous_format)

    def distributed(self) -> bool:
        try:
            return self.trainer.world_size > 1
        except RuntimeError:  # not attached to a Trainer (metrics computed by hand): nothing to sync with
            return False

    def gather_from_processes(self, state: torch.Tensor, group=None) -> list[torch.Tensor]:
        """`state` (of one shape and dtype in every process) from each process, in rank order."""
        strategy = self.trainer.strategy
        if isinstance(strategy, DDPStrategy) and torch.distributed.is_initialized():
            # Not Lightning's DDP all_gather: its autograd-aware collective is deprecated (a warning per process).
            gathered = [torch.zeros_like(state) for _ in range(strategy.world_size)]
            torch.distributed.all_gather(gathered, state.contiguous())
            return gathered
        return list(strategy.all_gather(state).unbind(0))  # Horovod's allgather

    @property
    def backbone(self) -> nn.Module:  # a transfer-learning network's pretrained part, for `BackboneFinetuning`
        return self.network.backbone

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.hparams.channels_last and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return self.network(inputs)

    def _step(self, batch: tuple[torch.Tensor, torch.Tensor], split: str) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, labels = batch
        if self.input_shape is None:  # the first batch: a network made for other inputs is one line, not a traceback
            try:
                logits = self(inputs)
            except RuntimeError as error:
                raise InputShapeError(
                    f"model.network: the data's inputs of shape {tuple(inputs.shape[1:])} do not fit it "
                    f"({str(error).strip().splitlines()[0]}); give a network made for them (a lazy first layer, as "
                    "lightning_modules.table_net.TableNet's, takes any width)"
                ) from None
            self.input_shape = tuple(inputs.shape[1:])
        else:
            logits = self(inputs)
        loss = F.cross_entropy(logits, labels)
        loss_metric, accuracy = self.metrics[f"{split}_loss"], self.metrics[f"{split}_acc"]
        loss_metric.update(loss.detach(), len(labels))  # weighted by the batch's size: the mean over samples
        accuracy.update(logits.detach(), labels)
        return loss, logits

    def log_epoch(self, split: str) -> None:
        """`split`'s metric objects, logged once an epoch (Lightning computes, syncs and resets them): logged at every
        step, Lightning moves each to the device on each call, 24% of a CPU MNIST epoch (docs/measured.md)."""
        for name in (f"{split}_loss", f"{split}_acc"):
            if self.metrics[name].update_count:  # an epoch of no batch logs nothing, as no step logged it
                self.log(name, self.metrics[name], prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        self.log_epoch("val")

    def on_test_epoch_end(self) -> None:
        self.log_epoch("test")

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss, _ = self._step(batch, "train")
        self.samples += len(batch[1])
        every = self.trainer.log_every_n_steps  # 0: no step-level curve, as in Lightning
        if self.loggers and every and (self.global_step + 1) % every == 0:
            for logger in self.loggers:
                logger.log_metrics({"train_loss_step": loss.item()}, step=self.global_step)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self._step(batch, "test")[1].detach()  # the logits, for the evaluation report (run_record.py)

    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> list[tuple[str, float]]:
        probabilities, indices = F.softmax(self(batch[0]), dim=1).max(dim=1)
        return [(self.class_names[i], p) for i, p in zip(indices.tolist(), probabilities.tolist())]

    def on_train_epoch_start(self) -> None:
        self.samples, self.epoch_started = 0, time.perf_counter()

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if batch_idx == self.trainer.num_training_batches - 1:  # validation, which may follow, is not counted
            if self.device.type == "cuda":  # else the clock stops while the GPU still works on the steps queued
                torch.cuda.synchronize(self.device)
            self.epoch_seconds = time.perf_counter() - self.epoch_started

    def on_train_epoch_end(self) -> None:
        if not self.samples:  # no training step this epoch
            return
        # compute() syncs the processes once; Lightning's own, at the epoch's end, reads the cached value.
        values = {name: self.metrics[name].compute().item() for name in ("train_loss", "train_acc")}
        self.log_epoch("train")
        self.check_finite(values["train_loss"])  # before the epoch's checkpoints (the callbacks' hook comes after)
        if self.epoch_seconds > 0:  # the samples every process trained on (equal shares), per second
            values["train_samples_per_sec"] = self.samples * self.trainer.world_size / self.epoch_seconds
            self.log("train_samples_per_sec", values["train_samples_per_sec"], prog_bar=True)
        self.train_epoch_metrics = {"epoch": self.current_epoch, "step": self.global_step - 1, "values": values}

    def check_finite(self, loss: float) -> None:
        """Stops a fit whose epoch loss or weights are no longer finite, before the epoch's checkpoints (they keep the
        last finite epoch); the run shows the loss."""
        weights_finite = bool(torch.stack([p.detach().isfinite().all() for p in self.parameters()]).all())
        if math.isfinite(loss) and weights_finite:
            return
        for logger in self.loggers:
            logger.log_metrics({"train_loss": loss, "epoch": self.current_epoch}, step=self.global_step)
        what = f"train_loss is {loss}" if not math.isfinite(loss) else "the weights are no longer finite numbers"
        raise DivergedError(
            f"training diverged at epoch {self.current_epoch}: {what}; no checkpoint of it is written (best.ckpt "
            "and last.ckpt keep the last finite epoch, if any); lower model.optimizer.init_args.lr or check the data"
        )

    # Lightning logs an epoch's training metrics after its checkpoints: they travel in them, for a resumed fit to send.
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.train_epoch_metrics is not None:
            checkpoint["train_epoch_metrics"] = self.train_epoch_metrics
        if self.input_shape is not None:
            checkpoint["input_shape"] = list(self.input_shape)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if self.strict_loading and not weights_fit(self.state_dict(keep_vars=True), checkpoint.get("state_dict", {})):
            from lightning_modules.checkpoint_fit import check_network_fits  # one line, not load_state_dict's error

            check_network_fits(self, checkpoint)
        self.train_epoch_metrics = checkpoint.get("train_epoch_metrics")
        if checkpoint.get("input_shape"):
            self.input_shape = tuple(checkpoint["input_shape"])

    def on_train_start(self) -> None:
        if self.train_epoch_metrics is not None:  # read back from the checkpoint this fit resumes from
            record = self.train_epoch_metrics
            for logger in self.loggers:
                logger.log_metrics({**record["values"], "epoch": record["epoch"]}, step=record["step"])

    def configure_optimizers(self):
        trainable = [p for p in self.parameters() if p.requires_grad]  # frozen backbones stay out
        try:
            optimizer = self.optimizer_factory(trainable)
        except (ValueError, TypeError) as error:  # torch.optim's own checks, e.g. "Invalid learning rate: -0.1"
            raise OptimizerError(f"model.optimizer: {error}; correct its init_args (see --print_config)") from None
        if self.hparams.scale_lr_by_world_size:
            for group in optimizer.param_groups:
                group["lr"] *= self.trainer.world_size
        if self.scheduler_factory is not None:
            return {"optimizer": optimizer, "lr_scheduler": self.scheduler_factory(optimizer)}
        if self.hparams.warmup_steps == 0 and self.hparams.poly_decay_power == 0:
            return optimizer
        from lightning_modules.schedules import warmup_poly_schedule

        hparams, total_steps = self.hparams, int(self.trainer.estimated_stepping_batches)
        schedule = warmup_poly_schedule(optimizer, hparams.warmup_steps, total_steps, hparams.poly_decay_power)
        return {"optimizer": optimizer, "lr_scheduler": schedule}
