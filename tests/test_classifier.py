"""ClassificationModule: optimizer injection, warm-up and decay, lr scaling, predictions as class names, and each
epoch's metrics its own."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules.classifier import ClassificationModule
from lightning_modules.penguin_net import PenguinNet
from lightning_modules.schedules import warmup_poly_factor


def module(**kwargs) -> ClassificationModule:
    model = ClassificationModule(PenguinNet, ["Adelie", "Gentoo", "Chinstrap"], **kwargs)
    model._trainer = SimpleNamespace(world_size=4, estimated_stepping_batches=100)
    return model


def test_penguin_net_is_the_course_shape():
    sizes = [(m.in_features, m.out_features) for m in PenguinNet(3) if isinstance(m, torch.nn.Linear)]
    assert sizes == [(5, 10), (10, 10), (10, 3)]


def test_default_optimizer_is_adam_at_1e_3_over_trainable_parameters():
    model = module()
    model.network[0].weight.requires_grad_(False)
    optimizer = model.configure_optimizers()
    assert isinstance(optimizer, torch.optim.Adam) and optimizer.param_groups[0]["lr"] == 1e-3
    assert sum(len(g["params"]) for g in optimizer.param_groups) == 5  # 6 tensors, one frozen


def test_injected_optimizer_and_world_size_scaling():
    model = module(optimizer=partial(torch.optim.SGD, lr=0.01, momentum=0.5), scale_lr_by_world_size=True)
    optimizer = model.configure_optimizers()
    assert isinstance(optimizer, torch.optim.SGD)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.04)


def test_warmup_then_polynomial_decay_per_step():
    model = module(warmup_steps=10, poly_decay_power=1.0)
    config = model.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert config["lr_scheduler"]["interval"] == "step"
    lrs = []
    for _ in range(100):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert lrs[10] == pytest.approx(1e-3) and lrs[55] == pytest.approx(0.5e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))


def test_schedule_factor_shapes():
    assert warmup_poly_factor(0, 4, 10, 2.0) == 0.25
    assert warmup_poly_factor(7, 4, 10, 0.0) == 1.0
    assert warmup_poly_factor(7, 4, 10, 2.0) == pytest.approx((1 - 3 / 6) ** 2)
    assert warmup_poly_factor(10, 4, 10, 1.0) == 0.0


def test_predict_step_returns_class_names_and_probabilities():
    model = module()
    predictions = model.predict_step((torch.randn(7, 5),), 0)
    assert len(predictions) == 7
    assert all(name in model.class_names and 1 / 3 <= p <= 1 for name, p in predictions)


def test_channels_last_changes_memory_order_not_results():
    from lightning_modules.mnist_net import MNISTNet

    torch.manual_seed(0)
    default = ClassificationModule(MNISTNet, [str(d) for d in range(10)]).eval()
    nhwc = ClassificationModule(MNISTNet, [str(d) for d in range(10)], channels_last=True).eval()
    nhwc.load_state_dict(default.state_dict())  # copies into the channels-last parameters, keeping their order
    conv = nhwc.network.conv2.weight  # (conv1 has one input channel: both orders coincide)
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    images = torch.randn(4, 1, 28, 28)
    assert torch.allclose(nhwc(images), default(images), atol=1e-5)
    assert module(channels_last=True)(torch.randn(3, 5)).shape == (3, 3)  # tables pass through untouched


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_channels_last_leaves_a_weight_of_one_input_channel_in_the_default_strides_on_a_gpu(device):
    """Its elements are in the same order either way, but cuDNN hands back its gradient in the default strides, and
    DDP warned at every GPU run that the gradient does not match its bucket's layout (seen with NCCL on an H100). On a
    CPU the weight stays channels-last: a contiguous one beside channels-last inputs takes a slower convolution."""
    from types import SimpleNamespace

    from lightning_modules.mnist_net import MNISTNet

    nhwc = ClassificationModule(MNISTNet, [str(d) for d in range(10)], channels_last=True)
    nhwc.trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)))
    nhwc.setup("fit")
    conv1, conv2 = nhwc.network.conv1.weight, nhwc.network.conv2.weight
    default_strides = torch.empty(conv1.shape).stride()
    assert conv1.shape[1] == 1 and (conv1.stride() == default_strides) == (device == "cuda")
    assert conv2.is_contiguous(memory_format=torch.channels_last) and not conv2.is_contiguous()


def test_log_every_n_steps_zero_turns_the_step_curve_off(tmp_path):
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    from datamodules.penguins import PenguinDataModule

    logger = CSVLogger(tmp_path)
    trainer = L.Trainer(
        max_epochs=1, log_every_n_steps=0, logger=logger, enable_checkpointing=False, enable_progress_bar=False
    )
    trainer.fit(ClassificationModule(PenguinNet, PenguinDataModule.class_names), datamodule=PenguinDataModule())
    header = (Path(logger.log_dir) / "metrics.csv").read_text().splitlines()[0]
    assert "train_loss" in header and "train_loss_step" not in header


def test_attributes_set_on_the_module_end_where_nn_module_puts_them():
    """ClassificationModule's short way for plain attributes (Lightning sets one around every hook) leaves tensors and
    modules to nn.Module: each assignment ends where it would on a plain nn.Module."""

    def assign(model: torch.nn.Module) -> list:
        model.plain = 1
        model.plain = "again"  # a plain attribute set again: the short way
        model.replaced = 2
        model.replaced = torch.nn.Linear(1, 1)  # a module where a plain value was: registered as a submodule
        model.weightish = 3
        model.weightish = torch.nn.Parameter(torch.zeros(1))  # a parameter likewise
        model.register_buffer("kept", torch.zeros(1))
        model.kept = torch.ones(1)  # a buffer stays a buffer
        model.train(False)
        return [model.plain, "replaced" in model._modules, "weightish" in model._parameters,
                "kept" in model._buffers, [name for name in ("replaced", "weightish", "kept") if name in vars(model)],
                model.training, model.network.training]  # fmt: skip

    plain = torch.nn.Module()
    plain.network = PenguinNet(3)
    assert assign(module()) == assign(plain) == ["again", True, True, True, [], False, False]


class EpochRecorder(L.Callback):
    """What each epoch's metrics must be, worked out apart from the module's metric objects: the mean of the epoch's
    own step losses (weighted by batch size), and validation measured anew on the weights of that epoch."""

    def __init__(self, val: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.val, self.train_loss, self.val_metrics, self.steps = val, [], [], []

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.steps = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.steps.append((outputs["loss"].item(), len(batch[1])))

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.train_loss.append(sum(loss * n for loss, n in self.steps) / sum(n for _, n in self.steps))

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        with torch.no_grad():
            logits = pl_module(self.val[0])
        loss = torch.nn.functional.cross_entropy(logits, self.val[1]).item()
        self.val_metrics.append((loss, (logits.argmax(1) == self.val[1]).float().mean().item()))


class Metrics(Logger):
    """Every metric Lightning hands a logger, with its epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[dict] = []

    name, version = "metrics", 0

    def log_metrics(self, metrics, step=None) -> None:
        self.logged.append(dict(metrics))

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def epoch_values(self, key: str) -> list[float]:
        return [entry[key] for entry in self.logged if key in entry]


def test_each_epoch_s_metrics_are_that_epoch_s_alone_over_two_epochs(tmp_path):
    """A metric that is not reset (or reset at the wrong time, or fed the sanity check's batches) would mix epochs:
    each epoch's train_loss must be the mean of its own steps, and val_loss and val_acc those of its own weights."""
    torch.manual_seed(0)
    inputs, labels = torch.randn(48, 5), torch.randint(0, 3, (48,))
    val = (torch.randn(20, 5), torch.randint(0, 3, (20,)))
    recorder, logger = EpochRecorder(val), Metrics()
    model = ClassificationModule(PenguinNet, ["a", "b", "c"], optimizer=partial(torch.optim.SGD, lr=0.5))
    trainer = L.Trainer(max_epochs=2, logger=logger, callbacks=[recorder], enable_checkpointing=False,
                        enable_progress_bar=False, default_root_dir=tmp_path, num_sanity_val_steps=2)  # fmt: skip
    train_loader = DataLoader(TensorDataset(inputs, labels), batch_size=10)  # a last batch of 8
    trainer.fit(model, train_loader, DataLoader(TensorDataset(*val), batch_size=7))
    assert logger.epoch_values("train_loss") == pytest.approx(recorder.train_loss, rel=1e-5)
    assert logger.epoch_values("val_loss") == pytest.approx([loss for loss, _ in recorder.val_metrics], rel=1e-5)
    assert logger.epoch_values("val_acc") == pytest.approx([acc for _, acc in recorder.val_metrics])
    assert recorder.train_loss[0] != pytest.approx(recorder.train_loss[1])  # the two epochs differ: a mix would show
    assert len(logger.epoch_values("train_acc")) == 2
