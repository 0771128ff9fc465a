"""The registered model: a network saved as an MLflow pyfunc model (scripts/serving/pyfunc_model.py: raw rows or
images in, classes and probabilities out, with ONNX Runtime and the datamodule's torch-free preprocessing; no torch),
and its registration. scripts.train registers the best checkpoint with it; scripts.serve saves a checkpoint the same
way, and scripts.export writes the same ONNX file.

    python -m scripts.train fit --config configs/penguins.yaml --register_model penguins-classifier
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import os
import shlex
import shutil
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch

from datamodules.base import ClassificationDataModule
from datamodules.errors import DataError

TOLERANCE = 1e-4  # float32 kernels of ONNX Runtime and PyTorch differ around 1e-6 on these nets


class ExportError(Exception):
    """A bad checkpoint, output path or export; the message names the file and what to do."""


class RegistryError(ExportError):
    """The MLflow registry refused a new version (a name's version taken by a concurrent registration, no permission);
    the model's files are logged to the run already: runs:/RUN_ID/model registers them later."""


def test_inputs(datamodule: ClassificationDataModule, batches: int) -> list[torch.Tensor]:
    """The network's inputs of the first `batches` test batches, after the hooks a Trainer would run."""
    datamodule.prepare_data()
    datamodule.setup("test")
    inputs = []
    for batch in itertools.islice(datamodule.test_dataloader(), batches):
        batch = datamodule.on_after_batch_transfer(datamodule.on_before_batch_transfer(batch, 0), 0)
        inputs.append(batch[0])
    if not inputs:
        raise DataError(f"{type(datamodule).__name__}: the test split is empty; nothing to check the export on")
    return inputs


def write_onnx(network: torch.nn.Module, inputs: list[torch.Tensor], target: Path, opset: int = 18) -> float:
    """Writes `network` (in eval mode) as ONNX at `target` and returns the largest |onnx - torch| over `inputs` and a
    batch of another size; raises ExportError above TOLERANCE, leaving an earlier file at `target` in place. Used by
    `export` and by scripts.training.tracking.save_model (the ONNX file of a registered model)."""
    import onnxruntime

    example = inputs[0]
    if len(example) < 2:
        example = torch.cat([example, example])  # torch.export takes a size-1 dimension for a constant
    # Another batch size than the exported one: ONNX Runtime rejects it unless the batch axis is dynamic.
    inputs = [*inputs, example[: len(example) // 2]]
    # The dynamo exporter (torch.export + onnxscript, the default since torch 2.9) handles every network here
    # with onnxscript 0.7.2; the TorchScript one (dynamo=False) works too but is deprecated. Weights stay
    # inside the one file (external_data=False: the nets are far below ONNX's 2 GB limit). Written beside the
    # target first, so a failed export or check leaves an earlier good file in place.
    part = target.with_name(target.name + ".part")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        torch.onnx.export(
            network,
            (example,),
            part,
            input_names=["input"],
            output_names=["logits"],
            dynamic_shapes=({0: torch.export.Dim("batch")},),
            opset_version=opset,
            external_data=False,
            dynamo=True,
            verbose=False,
        )
        session = onnxruntime.InferenceSession(part, providers=["CPUExecutionProvider"])
        differences = []
        with torch.no_grad():
            for batch in inputs:
                (logits,) = session.run(["logits"], {"input": batch.numpy()})
                differences.append((torch.from_numpy(logits) - network(batch)).abs().max())
        difference = torch.stack(differences).max().item()  # torch's max keeps a NaN, Python's may drop it
        sizes = ", ".join(str(len(batch)) for batch in inputs)
        if not difference <= TOLERANCE:  # `not <=` so that NaN fails too
            raise ExportError(
                f"{target}: ONNX Runtime's logits differ from PyTorch's by {difference:.1e} > {TOLERANCE:.0e} "
                f"(batch sizes {sizes}); nothing written. Try another --opset"
            )
        part.replace(target)
    finally:
        part.unlink(missing_ok=True)
    return difference


REPO = Path(__file__).resolve().parents[2]
SERVING_ENVIRONMENT = REPO / "scripts" / "serving" / "environment.yml"
# What the model's predict runs, shipped inside it: its PythonModel and the shared torch-free preprocessing.
SHIPPED = ["scripts/serving/pyfunc_model.py", "datamodules/errors.py", "datamodules/preprocessing"]
NOT_IN_THE_SERVING_ENVIRONMENT = {"torch", "torchvision", "torchmetrics", "lightning", "lightning_fabric"}


def serving_inputs(datamodule: ClassificationDataModule) -> dict | None:
    """How the registered model reads raw inputs: `kind` (rows or images), the datamodule's torch-free
    `preprocess` function ("module:name") and the values it needs (`state`), its input example and signature columns;
    None for a datamodule without a serving_kind (it cannot be registered)."""
    datamodule_class = type(datamodule)
    kind = datamodule_class.serving_kind
    if kind is None:
        return None
    function = datamodule_class.serving_preprocess
    name = datamodule_class.__name__
    if function is None or "." in function.__qualname__ or function.__module__ == "__main__":
        raise ExportError(
            f"{name}: its serving_preprocess is not a function at the top of a module; set serving_preprocess = "
            "staticmethod(a function of a module that imports only numpy, pandas and Pillow), as the README's "
            "Add your own dataset says"
        )
    # A datamodule built from a checkpoint has the state its network was trained with, and perhaps no data.
    state = getattr(datamodule, "checkpoint_serving_state", None)
    return {
        "kind": kind,
        "datamodule": f"{datamodule_class.__module__}.{datamodule_class.__qualname__}",
        "preprocess": f"{function.__module__}:{function.__qualname__}",
        "state": state if state is not None else datamodule.serving_state(),
        # The datamodule's own (after setup, or from its checkpoint): a table's columns come from its data.
        "example": datamodule.serving_example(),
        "columns": datamodule.serving_columns(),
        "column_kinds": datamodule.serving_column_kinds() if kind == "rows" else {},
        # The data it was trained on (datamodules/base.py data_identity), less each row's or file's hash (the
        # checkpoint has them).
        "data": {
            key: value
            for key, value in (getattr(datamodule, "identity", None) or {}).items()
            if key not in ("row_hashes", "files")
        },
    }


def serving_requirements() -> list[str]:
    """The model's pip requirements: the serving environment's pins (scripts/serving/environment.yml) but the
    inference server's, which the model does not import."""
    import yaml

    conda = yaml.safe_load(SERVING_ENVIRONMENT.read_text())
    (pip,) = [entry["pip"] for entry in conda["dependencies"] if isinstance(entry, dict)]
    return [requirement for requirement in pip if not requirement.startswith("azureml-inference-server-http")]


def code_to_ship(preprocess: str, target: Path) -> list[Path]:
    """Copies the model's code below `target`, as packages (datamodules/, scripts/, the preprocessing function's own
    package), and returns the top folders for MLflow's code_paths. Refuses code that imports torch or Lightning, or a
    module of this repository that is not shipped: the model must run in the serving environment."""
    module = preprocess.partition(":")[0]
    spec = importlib.util.find_spec(module)
    source = Path(spec.origin).resolve()
    try:
        own = [str(source.relative_to(REPO))]
    except ValueError:
        raise ExportError(f"{source}: the serving_preprocess module is outside the repository {REPO}") from None
    for relative in SHIPPED + own:
        path = REPO / relative
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            copy = target / file.relative_to(REPO)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, copy)
            parent = file.parent
            while parent != REPO:  # every package on the way, for the imports
                if (parent / "__init__.py").is_file():
                    shutil.copyfile(parent / "__init__.py", target / parent.relative_to(REPO) / "__init__.py")
                parent = parent.parent
    for file in sorted(target.rglob("*.py")):
        check_imports(file, target)
    return sorted(path for path in target.iterdir() if path.is_dir())


def check_imports(file: Path, shipped: Path) -> None:
    """ExportError when `file` imports torch or Lightning, or a module of the repository that is not in `shipped`."""
    original = REPO / file.relative_to(shipped)
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] in NOT_IN_THE_SERVING_ENVIRONMENT:
                raise ExportError(
                    f"{original}: imports {name}, which the registered model's environment has not (no torch, no "
                    "Lightning); keep serving_preprocess and what it imports in modules of numpy, pandas and Pillow"
                )
            where = shipped.joinpath(*parts)
            if (REPO / parts[0] / "__init__.py").is_file() and not (
                where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()
            ):
                raise ExportError(
                    f"{original}: imports {name}, which the registered model does not ship; import only "
                    "datamodules.errors, datamodules.preprocessing, numpy, pandas and Pillow there"
                )


def save_model(
    network: torch.nn.Module,
    example: torch.Tensor,
    class_names: list[str],
    folder: str | Path,
    inputs: dict | None,
) -> None:
    """Saves `network` in `folder` as an MLflow pyfunc model (scripts/serving/pyfunc_model.py) that takes raw inputs:
    the network as ONNX (`artifacts/model.onnx`, checked against PyTorch on `example`, the network's input, as
    scripts.export checks) and as torch.export's program (`artifacts/model.pt2`, for torch users); the class names,
    `inputs` (`serving_inputs`: the input kind, the preprocessing function and its state) in its model_config; the
    preprocessing code itself (code_paths); a signature and input example from the datamodule's; the serving
    environment's pins as requirements, and its uv.lock and pyproject.toml as the model's uv project."""
    import mlflow
    import pandas as pd
    from mlflow.models import ModelSignature
    from mlflow.types.schema import AnyType, ColSpec, Schema

    from scripts.serving.pyfunc_model import IMAGE_COLUMN, ClassifierModel, InputError

    if inputs is None:
        raise ExportError(
            "the datamodule has no serving_kind: give it serving_kind, serving_state, serving_preprocess (the "
            "README's Add your own dataset) to register or serve its network"
        )
    network, example = network.eval().cpu(), example[:8].cpu()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # MLflow's check of the input example
    config = {key: inputs[key] for key in ("kind", "preprocess", "state")} | {"class_names": list(class_names)}
    if inputs["kind"] == "rows":
        raw = inputs["example"]
        # Untyped: MLflow's enforcement of "double" refuses int64 (a CSV column of whole numbers, pandas' reading of
        # it), and of "string" refuses numbers (a category "3" sent as 3), where the preprocessing reads both. The
        # columns' kinds are in the metadata (`columns`) instead; docs/tasks.md says what each typing refused.
        columns = [ColSpec(AnyType(), column, required=False) for column in inputs["columns"]]
        if (inputs.get("state") or {}).get("fills_missing_cells"):
            # No input schema: MLflow's enforcement of one drops the columns it does not name before the model sees
            # them, and a JSON row's misspelt key became an empty cell, filled by the policy (a wrong answer). The
            # model checks its columns itself (datamodules/preprocessing/table_schema.py); `columns` below names them.
            columns = []
    else:
        raw = pd.DataFrame({IMAGE_COLUMN: list(inputs["example"])})
        columns = [ColSpec("binary", IMAGE_COLUMN)]
    with tempfile.TemporaryDirectory() as staging:
        staging = Path(staging)
        code = code_to_ship(inputs["preprocess"], staging / "code")
        onnx, pt2 = staging / "model.onnx", staging / "model.pt2"
        try:
            write_onnx(network, [example], onnx)
        except ExportError:
            raise
        except Exception as error:  # the exporter's many types
            reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ExportError(
                f"the network cannot be written as ONNX ({reason}); the registered model runs it with ONNX Runtime"
            ) from None
        pair = example if len(example) > 1 else torch.cat([example, example])  # a size-1 axis would be a constant
        program = torch.export.export(network, (pair,), dynamic_shapes=({0: torch.export.Dim("batch")},))
        torch.export.save(program, pt2)  # any batch size
        trial = ClassifierModel()  # the example's answer gives the output schema (and checks the model once)
        trial.load_context(SimpleNamespace(model_config=config, artifacts={"onnx": str(onnx)}))
        try:
            output = trial.answer(raw)
        except InputError as error:
            raise ExportError(f"the datamodule's serving_example: {error}") from None
        outputs = [ColSpec("string", "class"), *(ColSpec("double", column) for column in output.columns[1:])]
        with warnings.catch_warnings(), QuietLogger("mlflow.pyfunc", "mlflow.models", "mlflow.utils.uv_utils"):
            warnings.simplefilter("ignore")  # MLflow's advice to save code rather than an object: it is code
            mlflow.pyfunc.save_model(
                str(folder),
                python_model=ClassifierModel(),
                artifacts={"onnx": str(onnx), "pt2": str(pt2)},
                code_paths=[str(path) for path in code],
                model_config=config,
                signature=ModelSignature(inputs=Schema(columns) if columns else None, outputs=Schema(outputs)),
                input_example=raw,
                pip_requirements=serving_requirements(),
                # MLflow copies a uv project's uv.lock and pyproject.toml into the model, for `--env-manager uv` to
                # `uv sync`: the serving environment's, not those of the folder it is saved from (the training
                # project's: torch, Lightning and ~130 more).
                uv_project_path=str(SERVING_ENVIRONMENT.parent),
                metadata={
                    "class_names": list(class_names),
                    "inputs": {key: inputs[key] for key in ("kind", "datamodule", "preprocess")},
                    **({"columns": inputs["column_kinds"]} if inputs.get("column_kinds") else {}),
                    **({"data": inputs["data"]} if inputs.get("data") else {}),
                },
            )


class QuietLogger:
    """Raises the level of some loggers to ERROR for a while (MLflow's INFO and WARNING lines about saving)."""

    def __init__(self, *names: str) -> None:
        import logging

        self.loggers = [logging.getLogger(name) for name in names]

    def __enter__(self) -> None:
        import logging

        self.levels = [logger.level for logger in self.loggers]
        for logger in self.loggers:
            logger.setLevel(logging.ERROR)

    def __exit__(self, *exc) -> None:
        for logger, level in zip(self.loggers, self.levels):
            logger.setLevel(level)


def register_model(
    tracking_uri: str,
    run_id: str,
    network: torch.nn.Module,
    example: torch.Tensor,
    class_names: list[str],
    name: str,
    inputs: dict | None = None,
) -> str:
    """Saves `network` as an MLflow model (`save_model`) in the run's artifacts (`model/`) and registers it as a new
    version of `name`; returns the version.

    It is saved locally and uploaded as plain artifacts, not with `log_model`: MLflow 3's `log_model` creates a
    "logged model" through REST routes that Azure ML's tracking does not serve (404). Inside Azure ML the registry is
    the workspace's, and `python -m scripts.deploy` serves a version of it from an online endpoint.

        python -m scripts.train fit --config configs/penguins.yaml --register_model penguins-classifier
    """
    with tempfile.TemporaryDirectory() as folder:
        save_model(network, example, class_names, f"{folder}/model", inputs)
        return register_folder(tracking_uri, run_id, f"{folder}/model", name)


def register_later(tracking_uri: str | None, run_id: str, name: str) -> str:
    """The shell command that registers the run's logged model (`model/`) as a version of `name`: MLflow's own
    register_model, what a RegistryError's message offers."""
    code = f"import mlflow; mlflow.register_model({f'runs:/{run_id}/model'!r}, {name!r})"
    command = f"python -c {shlex.quote(code)}"
    return f"MLFLOW_TRACKING_URI={shlex.quote(tracking_uri)} {command}" if tracking_uri else command


def register_folder(tracking_uri: str, run_id: str, folder: str | Path, name: str) -> str:
    """Logs a saved model folder as the run's `model/` artifacts and registers it as a new version of `name`; returns
    the version. register_model, and an Azure ML pipeline's register step (a train step's model output), use it."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    MlflowClient(tracking_uri).log_artifacts(run_id, str(folder), "model")
    mlflow.set_tracking_uri(tracking_uri)  # register_model's client, and the registry's, follow it
    try:
        version = mlflow.register_model(f"runs:/{run_id}/model", name)
    except MlflowException as error:
        raise RegistryError(str(error.message).strip().splitlines()[0]) from None
    finally:
        mlflow.set_tracking_uri(None)
    return str(version.version)
