"""Training and validation loss per epoch of one MLflow run, as a PNG (the course's loss plot).

python -m scripts.plot                 # the newest run in outputs/mlflow.db
python -m scripts.plot RUN_ID --tracking-uri sqlite:///outputs/mlflow.db --output loss.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_URI = "sqlite:///outputs/mlflow.db"


def plot_losses(run_id: str | None, tracking_uri: str, output: Path | None) -> Path:
    """Writes the PNG (default: outputs/<experiment id>/<run id>/loss.png) and returns its path."""
    import matplotlib

    matplotlib.use("Agg")  # no screen needed
    import matplotlib.pyplot as plt
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    if run_id is None:
        runs = client.search_runs(
            [e.experiment_id for e in client.search_experiments()], order_by=["start_time DESC"], max_results=1
        )
        if not runs:
            raise SystemExit(f"error: no runs in {tracking_uri}; train first (make train)")
        run_id = runs[0].info.run_id
    run = client.get_run(run_id)
    figure, axes = plt.subplots(figsize=(7, 4))
    for key, label in (("train_loss", "training"), ("val_loss", "validation")):
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
        axes.plot([m.step + 1 for m in history], [m.value for m in history], label=label)
    if not axes.lines or not axes.lines[0].get_xdata().size:
        raise SystemExit(f"error: run {run_id} has no train_loss metric to plot")
    axes.set(xlabel="epoch", ylabel="loss", title=f"{run.info.run_name} ({run_id[:8]})")
    axes.legend()
    if output is None:
        output = Path("outputs") / run.info.experiment_id / run_id / "loss.png"
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=100, bbox_inches="tight")
    return output


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_id", nargs="?", help="MLflow run id (default: the newest run)")
    parser.add_argument("--tracking-uri", default=DEFAULT_URI)
    parser.add_argument("--output", type=Path, help="PNG path (default: outputs/<experiment>/<run>/loss.png)")
    args = parser.parse_args(argv)
    from mlflow.exceptions import MlflowException

    try:
        print(plot_losses(args.run_id, args.tracking_uri, args.output))
    except MlflowException as error:
        sys.exit(
            f"error: {args.tracking_uri}: {error.message.splitlines()[0]}; give a run id of this store (`make "
            "mlflow-ui` lists them), or none for the newest run"
        )


if __name__ == "__main__":
    main()
