"""The pruners a sweep file names, on real Optuna studies whose trials report per-epoch values (no training):
BanditPruner against Azure ML's Bandit rule, and what each early_termination section builds."""

from __future__ import annotations

import optuna
import pytest

from scripts.sweeps.space import Termination
from scripts.sweeps.trial import BanditPruner, make_pruner


def study_with(direction: str, finished: list[list[float]], pruner) -> optuna.Study:
    """A study whose finished trials reported these per-epoch values."""
    study = optuna.create_study(direction=direction, pruner=pruner)
    for values in finished:
        trial = study.ask()
        for epoch, value in enumerate(values):
            trial.report(value, epoch)
        study.tell(trial, values[-1])
    return study


def stops_at(study: optuna.Study, values: list[float]) -> int | None:
    """The first epoch at which a new trial reporting `values` is told to stop, or None."""
    trial = study.ask()
    for epoch, value in enumerate(values):
        trial.report(value, epoch)
        if trial.should_prune():
            return epoch
    return None


@pytest.mark.parametrize(
    ("direction", "slack", "best", "values", "epoch"),
    [
        # maximize, slack_factor 0.1: stop below best / 1.1 (0.9 -> 0.818...)
        ("maximize", {"slack_factor": 0.1}, [0.5, 0.9, 0.9], [0.5, 0.85, 0.85], None),
        ("maximize", {"slack_factor": 0.1}, [0.5, 0.9, 0.9], [0.5, 0.80, 0.85], 1),
        # maximize, slack_amount 0.05: stop below best - 0.05
        ("maximize", {"slack_amount": 0.05}, [0.5, 0.9, 0.9], [0.5, 0.84, 0.9], 1),
        # minimize, slack_factor 0.5: stop above best * 1.5
        ("minimize", {"slack_factor": 0.5}, [1.0, 0.2, 0.1], [1.0, 0.29, 0.16], 2),
        ("minimize", {"slack_amount": 0.1}, [1.0, 0.2, 0.1], [1.0, 0.29, 0.19], None),
    ],
)
def test_bandit_stops_a_trial_outside_the_slack_of_the_best_at_the_same_epoch(direction, slack, best, values, epoch):
    study = study_with(direction, [best], BanditPruner(**slack))
    assert stops_at(study, values) == epoch


def test_bandit_waits_for_its_delay_and_evaluates_at_its_interval():
    pruner = BanditPruner(slack_amount=0.01, delay_evaluation=2, evaluation_interval=2)
    study = study_with("maximize", [[0.9] * 6], pruner)
    # Far worse from epoch 0, but evaluated only at epochs 2, 4: stopped at 2.
    assert stops_at(study, [0.1] * 6) == 2
    assert stops_at(study, [0.1, 0.1, 0.9, 0.1, 0.9, 0.1]) is None  # within the slack at epochs 2 and 4


def test_bandit_needs_another_trial_at_that_epoch():
    study = study_with("maximize", [], BanditPruner(slack_factor=0.1))
    assert stops_at(study, [0.1, 0.1]) is None  # nothing to compare with


def test_each_policy_builds_its_pruner():
    median = make_pruner(Termination("median", delay_evaluation=3, evaluation_interval=2, startup_trials=4))
    assert isinstance(median, optuna.pruners.MedianPruner)
    study = study_with("minimize", [[1.0, 0.5, 0.4, 0.3, 0.2, 0.1]] * 4, median)
    assert stops_at(study, [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]) == 3  # warm-up 3 epochs, then every 2: epoch 3
    few = study_with("minimize", [[1.0, 0.5, 0.4, 0.3, 0.2, 0.1]] * 3, make_pruner(Termination("median")))
    assert stops_at(few, [1.0] * 6) is None  # fewer finished trials than startup_trials (5)
    bandit = make_pruner(Termination("bandit", slack_factor=0.2, delay_evaluation=1))
    assert (bandit.slack_factor, bandit.slack_amount, bandit.delay_evaluation) == (0.2, None, 1)
    assert isinstance(make_pruner(Termination("none")), optuna.pruners.NopPruner)


@pytest.mark.parametrize(
    "termination",
    [
        Termination("median", delay_evaluation=3, evaluation_interval=2, startup_trials=1),
        Termination("median", delay_evaluation=0, evaluation_interval=5, startup_trials=1),
        Termination("bandit", slack_amount=0.01, delay_evaluation=2, evaluation_interval=3),
        Termination("none"),
    ],
)
@pytest.mark.parametrize("steps", [list(range(12)), [0, 1, 2, 9, 10, 11]])  # every epoch; a gap (a resumed trial)
def test_a_trial_asks_its_pruner_only_where_the_pruner_can_stop_it(termination, steps):
    # A trial far worse than the finished one at every step: its pruner says stop wherever its warm-up and interval
    # let it; may_prune (no query of the study) must say yes at exactly those steps.
    from scripts.sweeps.trial import may_prune

    study = study_with("minimize", [[0.1] * 12], make_pruner(termination))
    trial, reported, asked = study.ask(), set(), []
    for step in steps:
        trial.report(5.0, step)
        asked.append((step, may_prune(termination, step, reported), trial.should_prune()))
        reported.add(step)
    assert [allowed for _, allowed, _ in asked] == [stop for _, _, stop in asked], asked
    assert any(stop for _, _, stop in asked) == (termination.policy != "none")
