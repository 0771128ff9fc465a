"""The trial's side of a local sweep: the callback scripts.sweep adds to each trial's fit, and the pruners.

scripts.sweep runs every trial as `python -m scripts.train fit --config <task> <the trial's values> ...
--trainer.callbacks+ '{"class_path": "scripts.sweeps.trial.SweepTrial", ...}'`. At every validation's end the
callback reports the objective metric to the study's storage (the sqlite file in outputs/sweeps, or a database
server) and, where the pruner can stop the trial, asks the study's pruner whether it should; when it should, the fit
ends after that epoch, as a finished fit does, and the trial is marked so that the sweep records it PRUNED. A loss or
an objective that is not finite (a diverging lr) stops the fit with TrialDiverged, an error: the sweep records the
trial FAIL. A fit whose sweep process is gone (killed) stops at the next batch instead of training for nobody.

Pruners, from the sweep file's early_termination: `median` is Optuna's MedianPruner (stop a trial whose best value
so far is worse than the median of the other trials at the same epoch), `bandit` is BanditPruner below (Azure ML's
Bandit policy: stop a trial that falls outside a slack of the best trial at the same epoch), `none` never stops one.
"""

from __future__ import annotations

import math
import os
import warnings

import lightning as L
import optuna

PRUNED_AT = "pruned_at_epoch"  # the trial's user attribute that tells the sweep it was pruned, not finished
TRIAL_ID = "SWEEP_TRIAL_ID"  # the variable scripts.sweep gives each trial's fit: its trial's id in the storage


class TrialDiverged(Exception):
    """A loss or the objective became NaN or infinite: the trial failed."""


class BanditPruner(optuna.pruners.BasePruner):
    """Azure ML's Bandit early termination: at each evaluation, a trial whose value at this epoch is not within
    `slack_factor` (a ratio) or `slack_amount` (an absolute distance) of the best trial's at the same epoch stops.

    Args:
        slack_factor, slack_amount: one of the two (Azure ML's BanditPolicy arguments).
        delay_evaluation: epochs before the first evaluation.
        evaluation_interval: epochs between evaluations.
    """

    def __init__(
        self,
        slack_factor: float | None = None,
        slack_amount: float | None = None,
        delay_evaluation: int = 0,
        evaluation_interval: int = 1,
    ) -> None:
        if (slack_factor is None) == (slack_amount is None):
            raise ValueError("give one of slack_factor and slack_amount")
        self.slack_factor, self.slack_amount = slack_factor, slack_amount
        self.delay_evaluation, self.evaluation_interval = delay_evaluation, evaluation_interval

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step < self.delay_evaluation or (step - self.delay_evaluation) % self.evaluation_interval:
            return False
        value = trial.intermediate_values[step]
        states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.RUNNING)
        others = [
            other.intermediate_values[step]
            for other in study.get_trials(deepcopy=False, states=states)
            if other.number != trial.number and step in other.intermediate_values
        ]
        others = [other for other in others if math.isfinite(other)]
        if not others:
            return False
        maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
        best = max(others) if maximize else min(others)
        if self.slack_factor is not None:
            bound = best / (1 + self.slack_factor) if maximize else best * (1 + self.slack_factor)
        else:
            bound = best - self.slack_amount if maximize else best + self.slack_amount
        return value < bound if maximize else value > bound


def make_pruner(termination) -> optuna.pruners.BasePruner:
    """The pruner of a sweep file's early_termination (scripts.sweeps.space.Termination)."""
    if termination.policy == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=termination.startup_trials,
            n_warmup_steps=termination.delay_evaluation,
            interval_steps=termination.evaluation_interval,
        )
    if termination.policy == "bandit":
        return BanditPruner(
            termination.slack_factor,
            termination.slack_amount,
            termination.delay_evaluation,
            termination.evaluation_interval,
        )
    return optuna.pruners.NopPruner()


def may_prune(termination, step: int, reported: set[int]) -> bool:
    """Whether the pruner of `termination` can stop a trial at `step`, `reported` its steps reported so far: the
    pruners' own first checks (warm-up, interval), without their query of the study. Optuna's median pruner reads
    every finished trial from the storage at each call, which costs more than a penguin epoch late in a sweep."""
    if termination.policy == "none" or step < termination.delay_evaluation:
        return False
    delay, interval = termination.delay_evaluation, termination.evaluation_interval
    if termination.policy == "bandit":
        return (step - delay) % interval == 0
    nearest = (step - delay) // interval * interval + delay  # optuna.pruners._percentile._is_first_in_interval_step
    return max((other for other in reported if other != step), default=-1) < nearest


HEARTBEAT_S, GRACE_S = 30, 120  # a trial whose sweep process has not been heard of for GRACE_S is stale


def open_storage(url: str, heartbeat: bool = False, checked: bool = False) -> optuna.storages.RDBStorage:
    """The study's storage; sqlite waits up to 60 s for a lock held by another trial or sweep process.

    With `heartbeat` (the sweep processes' storage), each running trial's sweep process records that it is alive
    every HEARTBEAT_S; a sweep process that starts a trial first fails the trials of processes silent for GRACE_S
    (a machine lost while another goes on with the study) and queues them again. `checked`: the sweep process that
    started this trial has created the tables and checked their schema version (a check is slow with sqlite:
    docs/measured.md)."""
    engine = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    if not heartbeat:
        return optuna.storages.RDBStorage(
            url, engine_kwargs=engine, skip_compatibility_check=checked, skip_table_creation=checked
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(
            url,
            engine_kwargs=engine,
            heartbeat_interval=HEARTBEAT_S,
            grace_period=GRACE_S,
            heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                inherit_intermediate_values=True
            ),
        )


class SweepTrial(L.Callback):
    """Reports `metric` at every validation's end to the trial of the study and stops the fit when the study's pruner
    says so; fails the fit when a loss or the objective is not finite, or when the sweep process that started it is
    gone.

    The trial is the one whose id is in SWEEP_TRIAL_ID, not an argument: the arguments are logged as the run's
    parameters, and a stopped trial that runs again goes on in the same MLflow run under another trial id (MLflow
    refuses a parameter that changes).

    Args:
        storage: the study's storage URL (sqlite:///outputs/sweeps/optuna.db or a database server's).
        study_name: the study.
        sweep_file: the sweep file, for its early-termination policy.
        metric: the objective, an epoch metric the module logs.
    """

    def __init__(self, storage: str, study_name: str, sweep_file: str, metric: str) -> None:
        self.storage_url, self.study_name, self.sweep_file, self.metric = storage, study_name, sweep_file, metric
        self.trial_id = int(os.environ[TRIAL_ID])
        self.sweep_pid = os.getppid()  # the sweep process that started it
        self.study: optuna.Study | None = None
        self.storage: optuna.storages.RDBStorage | None = None
        self.termination = None  # the sweep file's early_termination
        # The trial as the pruner sees it: its values in the storage when the fit started (a trial run again inherits
        # its first's), then this fit's reports.
        self.frozen: optuna.trial.FrozenTrial | None = None

    def open_study(self) -> None:
        """The study, its pruner, and the trial as stored when the fit started."""
        from scripts.sweeps.space import load_sweep

        self.termination = load_sweep(self.sweep_file).termination
        self.storage = open_storage(self.storage_url, checked=True)
        self.study = optuna.load_study(
            study_name=self.study_name,
            storage=self.storage,
            pruner=make_pruner(self.termination),
            sampler=optuna.samplers.RandomSampler(),
        )
        self.frozen = self.storage.get_trial(self.trial_id)

    def report(self, epoch: int, value: float) -> None:
        """As optuna.trial.Trial.report: the first value of an epoch stays (a fit resumed from a checkpoint reports
        again the epochs after it)."""
        if epoch not in self.frozen.intermediate_values:
            self.storage.set_trial_intermediate_value(self.trial_id, epoch, value)
            self.frozen.intermediate_values[epoch] = value

    def should_prune(self, epoch: int) -> bool:
        """What optuna.trial.Trial.should_prune answers: the study's pruner asked about the trial as it stands."""
        reported = set(self.frozen.intermediate_values) - {epoch}
        return may_prune(self.termination, epoch, reported) and self.study.pruner.prune(self.study, self.frozen)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if os.getppid() != self.sweep_pid:
            raise TrialDiverged(f"the sweep process {self.sweep_pid} is gone: this trial stops")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.check_finite(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self.check_finite(trainer)
        if self.metric not in trainer.callback_metrics:
            logged = ", ".join(sorted(trainer.callback_metrics)) or "nothing"
            raise TrialDiverged(f"objective {self.metric} was not logged this epoch; the module logged {logged}")
        prune = False
        if trainer.is_global_zero:
            epoch = trainer.current_epoch
            if self.study is None:
                self.open_study()
            self.report(epoch, float(trainer.callback_metrics[self.metric]))
            prune = self.should_prune(epoch)
            if prune:
                self.storage.set_trial_user_attr(self.trial_id, PRUNED_AT, epoch)
        if trainer.strategy.broadcast(prune, src=0):
            trainer.should_stop = True

    def check_finite(self, trainer: L.Trainer) -> None:
        for name, value in trainer.callback_metrics.items():
            if (name.endswith("loss") or name == self.metric) and not math.isfinite(float(value)):
                raise TrialDiverged(
                    f"{name} is {float(value)} at epoch {trainer.current_epoch}: the trial diverged (a smaller lr?)"
                )


class MetricNames(L.Callback):
    """Writes the names of the metrics a fit logged, one a line, to `path` (the sweep's check of its objective)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            with open(self.path, "w") as file:
                file.write("".join(f"{name}\n" for name in sorted(trainer.callback_metrics)))
