"""BufferedMLFlowLogger: metrics reach the MLflow store in batches, all of them, also when a run fails."""

from __future__ import annotations

import json
import threading
import time

import lightning as L
import pytest
import torch
from mlflow import MlflowClient
from torch.utils.data import DataLoader, TensorDataset

from scripts.training.resume import resend
from scripts.training.tracking import BufferedMLFlowLogger
from scripts.training.tracking_server import Sender


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    # MLflow's set_tracking_uri (the logger calls it) exports MLFLOW_TRACKING_URI; keep it from later tests' CLIs.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def logger_for(store: str, tmp_path, **options) -> BufferedMLFlowLogger:
    return BufferedMLFlowLogger("buffered", tracking_uri=store, artifact_location=tmp_path.as_uri(), **options)


def history(store: str, logger: BufferedMLFlowLogger, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in MlflowClient(store).get_metric_history(logger.run_id, key)]


def test_metrics_wait_for_the_interval_then_all_arrive_at_finalize(store, tmp_path):
    logger = logger_for(store, tmp_path, flush_every_s=3600)
    for epoch in range(3):
        logger.log_metrics({"val_loss": 1.0 / (epoch + 1)}, step=epoch)
    assert history(store, logger, "val_loss") == []
    logger.finalize("success")
    assert history(store, logger, "val_loss") == [(0, 1.0), (1, 0.5), (2, 1 / 3)]
    assert MlflowClient(store).get_run(logger.run_id).info.status == "FINISHED"


def test_unsent_metrics_carried_by_a_checkpoint_reach_their_own_run_only_once(store, tmp_path):
    first = logger_for(store, tmp_path, flush_every_s=0)
    for epoch in range(2):
        first.log_metrics({"val_loss": 1.0 / (epoch + 1)}, step=epoch)  # sent: epochs 0 and 1
    first.flush_every_s = 3600
    for epoch in range(2, 4):
        first.log_metrics({"val_loss": 1.0 / (epoch + 1)}, step=epoch)  # unsent when the process dies
    carried = first.unsent()
    assert isinstance(carried["metrics"], str)  # one object for torch.save to pickle, however many epochs
    assert [metric[3] for metric in json.loads(carried["metrics"])] == [2, 3] and carried["run_id"] == first.run_id

    # The fit resumed from that checkpoint, in the same run, has run again the epoch after its last.ckpt's: the
    # carried metrics go first, the steps the run has already are not sent twice.
    again = logger_for(store, tmp_path, flush_every_s=3600, run_id=first.run_id)
    resend(again, {**carried, "metrics": json.dumps([["val_loss", 9.0, 0, 1], *json.loads(carried["metrics"])])})
    again.log_metrics({"val_loss": 0.2}, step=4)
    again.finalize("success")
    assert history(store, again, "val_loss") == [(0, 1.0), (1, 0.5), (2, 1 / 3), (3, 0.25), (4, 0.2)]

    listed = logger_for(store, tmp_path, flush_every_s=3600, run_id=first.run_id)  # a checkpoint of the list format
    resend(listed, {**carried, "metrics": [["val_loss", 0.1, 0, 5]]})
    listed.log_metrics({"val_loss": 0.05}, step=6)
    listed.finalize("success")
    assert {(5, 0.1), (6, 0.05)} <= set(history(store, listed, "val_loss"))

    other = logger_for(store, tmp_path, flush_every_s=0)  # a new run started from someone else's checkpoint
    resend(other, carried)
    other.log_metrics({"val_loss": 0.125}, step=0)
    assert history(store, other, "val_loss") == [(0, 0.125)]


def test_zero_interval_sends_every_call(store, tmp_path):
    logger = logger_for(store, tmp_path, flush_every_s=0)
    logger.log_metrics({"val_loss": 0.25, "note": "text is dropped"}, step=7)
    assert history(store, logger, "val_loss") == [(7, 0.25)]
    assert history(store, logger, "note") == []


@pytest.mark.slow
def test_more_than_a_request_holds_goes_out_in_chunks(store, tmp_path):
    logger = logger_for(store, tmp_path, flush_every_s=3600)
    logger.log_metrics({f"m{i}": float(i) for i in range(2500)}, step=0)  # MLflow refuses > 1000 per request
    logger.finalize("success")
    metrics = MlflowClient(store).get_run(logger.run_id).data.metrics
    assert len(metrics) == 2500 and metrics["m2499"] == 2499.0


def test_epoch_metrics_are_logged_at_their_epoch_and_explicit_steps_kept(store, tmp_path):
    logger = logger_for(store, tmp_path, flush_every_s=0)
    logger.log_metrics({"val_loss": 0.5, "epoch": 3}, step=48)  # what Lightning's epoch-end flush sends
    logger.log_metrics({"train_loss_step": 0.75}, step=49)
    assert history(store, logger, "val_loss") == [(3, 0.5)]
    assert history(store, logger, "train_loss_step") == [(49, 0.75)]
    assert history(store, logger, "epoch") == []
    lightning_steps = logger_for(store, tmp_path, flush_every_s=0, epoch_as_step=False)
    lightning_steps.log_metrics({"val_loss": 0.5, "epoch": 3}, step=48)
    assert history(store, lightning_steps, "val_loss") == [(48, 0.5)]
    assert history(store, lightning_steps, "epoch") == [(48, 3.0)]


class FailsInThirdEpoch(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        if self.current_epoch == 2:
            raise RuntimeError("boom")
        return self.layer(batch[0]).pow(2).mean()

    def on_train_epoch_end(self) -> None:
        self.log("train_metric", float(self.current_epoch))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)


@pytest.mark.slow  # seconds of a worker: make test-fast stays under 2 minutes
def test_a_failing_run_still_sends_what_it_logged(store, tmp_path):
    logger = logger_for(store, tmp_path, flush_every_s=3600)
    trainer = L.Trainer(
        max_epochs=5, logger=logger, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path,
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(FailsInThirdEpoch())
    assert history(store, logger, "train_metric") == [(0, 0.0), (1, 1.0)]
    assert MlflowClient(store).get_run(logger.run_id).info.status == "FAILED"


def test_a_wait_times_a_call_from_its_start_not_from_the_call_before():
    """A checkpoint's wait gives up on a call older than its timeout (the server hangs). A call the sender thread has
    not picked up yet is new, however long ago the one before it started (an epoch of minutes)."""
    sender = Sender()
    sender.call_started = time.monotonic() - 60  # the last call began a minute ago
    sent = threading.Event()
    sender.put(lambda: (time.sleep(0.3), sent.set()), "metrics", 1)
    assert sender.wait(10)
    assert sent.is_set()
