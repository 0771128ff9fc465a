"""The run's plumbing under scripts.train: its MLflow logger, checkpoints, throughput and one-line CLI errors."""
