"""A sweep's internals: the sweep file, the trial's callback and pruners, its MLflow records, its Azure ML sweep job."""
