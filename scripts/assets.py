"""Register the tasks' data and the environments in an Azure ML workspace as named, versioned assets, so that jobs,
sweeps and deployments name them (azureml:penguins:3) instead of uploading local paths and building inline images.

    python -m scripts.assets data penguins data/penguins.csv --version 3 --mltable true
    python -m scripts.assets data mnist data/mnist --version 1
    python -m scripts.assets data birds data/birds --version 1
    python -m scripts.assets environment training --version 1      # lightning-training; training-gpu, serving
    python -m scripts.assets data penguins data/penguins.csv --version 3 --dry_run true   # print the YAML

`data` uploads a file or folder (with `--mltable true` a CSV also as NAME-table, an MLTable); `environment KIND`
registers environment.yml (training, training-gpu) or scripts/serving/environment.yml (serving) as lightning-KIND
(docs/azure-ml.md). Every mistake is one line and exit 1 before the Azure SDK is imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from scripts.azure_ml.assets import Asset, AssetError, asset_yaml, build, plan_data, plan_environment
from scripts.azure_ml.errors import SubmitError, service_line
from scripts.azure_ml.options import DryRun, run_command
from scripts.azure_ml.workspace import check_workspace_ids, not_signed_in, workspace_client
from scripts.azure_ml.yaml_files import check_not_written_over, check_yaml_dir


def create(assets: list[Asset], options: DryRun) -> str:
    """Prints (dry_run) or creates the assets; returns their YAML (dry_run) or their references."""
    dry_run, yaml_dir = options.dry_run, options.yaml_dir
    if yaml_dir and not dry_run:
        raise AssetError("--yaml_dir writes the YAML instead of creating the assets: add --dry_run true")
    check_yaml_dir(yaml_dir, "assets/")
    check_workspace_ids(*options.workspace_ids(), not dry_run)
    entities = [build(asset) for asset in assets]
    if dry_run:
        folder = Path(yaml_dir) if yaml_dir else Path(".")
        texts = [asset_yaml(entity, folder) for entity in entities]
        if yaml_dir:
            keys = {"data": ("name", "version", "type", "path"), "environment": ("name", "version")}
            written = {a.file_name: (f"an Azure ML {a.kind} asset's YAML", keys[a.kind]) for a in assets}
            check_not_written_over(folder, written, "--yaml_dir")
            folder.mkdir(parents=True, exist_ok=True)
            for asset, text in zip(assets, texts):
                (folder / asset.file_name).write_text(text)
                print(f"wrote {folder / asset.file_name}: az ml {asset.kind} create -f {folder / asset.file_name}")
        else:
            print("---\n".join(f"# {a.file_name}: {a.reference}\n{text}" for a, text in zip(assets, texts)), end="")
        return "---\n".join(texts)
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

    from scripts.azure_ml.storage import check_storage, upload_failure

    client = workspace_client(*options.workspace_ids())
    try:
        uploads = [asset.path for asset in assets if asset.kind == "data"]
        check_storage(
            client, uploads, "or run this command on a machine that reaches it (an Azure ML compute instance)"
        )
        for asset, entity in zip(assets, entities):
            operations = client.data if asset.kind == "data" else client.environments
            created = operations.create_or_update(entity)
            print(f"created {asset.kind} azureml:{created.name}:{created.version}")
    except ClientAuthenticationError:
        raise AssetError(not_signed_in("register")) from None
    except Exception as error:
        if line := upload_failure(error):  # the storage, not Azure ML, out of this machine's reach
            raise AssetError(line) from None
        if not isinstance(error, HttpResponseError):
            raise
        # e.g. the version exists with other content: versions are immutable
        raise AssetError(
            f"Azure ML refused {asset.reference}: {service_line(error)}; give the next --version"
        ) from None
    return " ".join(asset.reference for asset in assets)


def data(
    name: str,
    path: str,
    version: str = "",
    mltable: bool = False,
    description: str = "",
    **given,
) -> str:
    """Registers a local file or folder as a version of a data asset (and a CSV also as an MLTable).

    Args:
        name: the data asset's name, e.g. penguins, mnist, birds.
        path: the local file (a uri_file asset) or folder (uri_folder) to upload.
        version: the version to create, a number; versions are immutable, so each upload of changed data is the next.
        mltable: also register the CSV (or .tsv) as NAME-table, an MLTable of the same version.
        description: what the asset is; default: where it came from.
        given: --dry_run, --yaml_dir (data-NAME.yml files) and the workspace (scripts/azure_ml/options.py's DryRun).
    """
    assets = plan_data(name, path, version, mltable, description)
    return create(assets, DryRun(**given))


def environment(
    kind: Literal["training", "training-gpu", "serving"],
    version: str = "",
    name: str | None = None,
    description: str = "",
    **given,
) -> str:
    """Registers a version of the training (CPU or GPU image) or serving environment.

    Args:
        kind: training (environment.yml on Azure ML's Open MPI image), training-gpu (on its CUDA image) or serving
            (scripts/serving/environment.yml, what scripts.deploy serves with).
        version: the version to create, a number (Azure ML builds its image once, when a job first uses it).
        name: the environment's name; default: lightning-KIND.
        description: what it is; default: its packages and image.
        given: --dry_run, --yaml_dir (environment-NAME.yml) and the workspace (scripts/azure_ml/options.py's DryRun).
    """
    asset = plan_environment(kind, name, version, description)
    return create([asset], DryRun(**given))


def main(args: list[str] | None = None) -> None:
    """Every mistake is one line on stderr and exit 1."""
    run_command({"data": data, "environment": environment}, "scripts.assets", (SubmitError,), args)


if __name__ == "__main__":
    main()
