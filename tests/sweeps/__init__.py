"""The sweeps extra's tests: Optuna sweeps here, their files, trials, pruners and records."""
