"""scripts.deploy: the managed online endpoint and deployment of a registered MLflow model (no code by default, or
scripts/score.py), and the batch endpoint and its model deployment (tabular: no code; images: batch_score.py), checked
offline by the real azure-ai-ml objects: the YAML `az ml` takes through load_online_endpoint / load_online_deployment /
load_batch_endpoint / load_batch_deployment, and deployments through MLClient over tests/azure/fake_azure.py's
transport, grown the routes of online and batch endpoints."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from scripts.deploy import batch, main, online
from tests.azure.fake_azure import WORKSPACE, FakeAzureML, FakeCredential, fake_client, http_response
from tests.conftest import REPO

SCORING_URI = "https://penguins.westeurope.inference.ml.azure.com/score"
BATCH_URI = "https://birds-batch.westeurope.inference.ml.azure.com/jobs"


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)  # the deployment's code is this folder


class FakeEndpoints(FakeAzureML):
    """FakeAzureML with Azure ML's online and batch endpoint and deployment routes: a PUT is provisioned at once (a
    finished long-running operation), GET returns what was put, with what the service adds (scoring URI, scale
    settings); an endpoint giving a deployment both live and mirrored traffic is refused, as Azure ML refuses it."""

    def __init__(self) -> None:
        super().__init__()
        self.resources: dict[str, dict] = {}

    def request(self, method, url, data=None, **kwargs):
        path = url.split("?")[0].removeprefix("https://management.azure.com")
        resource = re.search(r"/(online|batch)Endpoints/[^/]+(/deployments/[^/]+)?$", path)
        if resource and method in ("PUT", "GET"):
            sent = json.loads(data) if data else None
            self.requests.append((method, path, sent))
            properties = (sent or {}).get("properties", {})
            live, mirrored = (
                {name for name, share in (properties.get(key) or {}).items() if share}
                for key in ("traffic", "mirrorTraffic")
            )
            if live & mirrored:  # Azure ML's documented rule; its own message is not known here
                message = f"Deployment(s) {', '.join(sorted(live & mirrored))} cannot take traffic and mirror traffic"
                body = json.dumps({"error": {"code": "BadArgument", "message": message}}).encode()
                return http_response(method, url, 400, body, {"Content-Type": "application/json"})
            if method == "PUT":
                answer = {"id": path, "name": path.rsplit("/", 1)[1], **sent}
                answer["properties"] = {**answer["properties"], "provisioningState": "Succeeded"}
                if resource.group(2) and resource.group(1) == "online":
                    answer["properties"]["scaleSettings"] = {"scaleType": "Default"}
                elif not resource.group(2):
                    answer["properties"]["scoringUri"] = SCORING_URI if resource.group(1) == "online" else BATCH_URI
                self.resources[path] = answer
            if path not in self.resources:
                return http_response(method, url, 404, b'{"error": {"code": "NotFound", "message": "no such"}}')
            return self.json(method, url, self.resources[path])
        if method == "GET" and re.search(r"/(online|batch)Endpoints/[^/]+/deployments$", path):
            self.requests.append((method, path, None))
            return self.json(method, url, {"value": [v for k, v in self.resources.items() if k.startswith(path)]})
        return super().request(method, url, data, **kwargs)

    @staticmethod
    def json(method, url, answer):
        return http_response(method, url, 200, json.dumps(answer).encode(), {"Content-Type": "application/json"})

    def sent(self, method: str, pattern: str) -> list[dict]:
        return [body for m, path, body in self.requests if m == method and re.search(pattern, path)]


def dry_run_entities(tmp_path, text: str, kind: str):
    """The endpoint and the deployment of a dry run's YAML, as `az ml` loads them from files at the repository root.
    A batch deployment is `type: model` with its `settings`, today's schema (modelBatchDeployment, as in Azure ML's
    examples), which `az ml batch-deployment create` reads with load_model_batch_deployment; load_batch_deployment
    reads only the older flat schema, whose BatchDeployment the SDK deprecates, and refuses `settings`."""
    import azure.ai.ml
    from azure.ai.ml.entities._load_functions import load_model_batch_deployment  # not exported by azure-ai-ml 1.35

    endpoint_text, deployment_text = text.split("---\n")
    (tmp_path / "endpoint.yml").write_text(endpoint_text)
    (tmp_path / "deployment.yml").write_text(deployment_text)
    endpoint = getattr(azure.ai.ml, f"load_{kind}_endpoint")(tmp_path / "endpoint.yml")
    if kind == "batch":
        assert yaml.safe_load(deployment_text)["type"] == "model"
        return endpoint, load_model_batch_deployment(tmp_path / "deployment.yml")
    return endpoint, azure.ai.ml.load_online_deployment(tmp_path / "deployment.yml")


def test_by_default_an_online_deployment_is_the_mlflow_model_alone_no_code_no_environment(tmp_path, capsys):
    text = online("models:/penguins-classifier/3", "penguins", "green", "Standard_F4s_v2", 2, "aml_token", workers=2,
                  dry_run=True)  # fmt: skip
    printed = capsys.readouterr().out
    assert printed.startswith("# endpoint.yml\n") and "---\n# deployment.yml\n" in printed
    endpoint, deployment = dry_run_entities(tmp_path, text, "online")
    assert (endpoint.name, endpoint.auth_mode) == ("penguins", "aml_token")
    assert (deployment.name, deployment.endpoint_name) == ("green", "penguins")
    assert deployment.model == "penguins-classifier:3"  # of the workspace's registry, where --register_model puts it
    assert deployment.code_configuration is None and deployment.environment is None  # Azure ML's no-code deployment
    assert (deployment.instance_type, deployment.instance_count) == ("Standard_F4s_v2", 2)
    assert deployment.environment_variables == {"WORKER_COUNT": "2"}
    assert deployment.request_settings.max_concurrent_requests_per_instance == 2


def test_scoring_script_deploys_score_py_in_the_serving_environment(tmp_path, capsys):
    text = online("penguins-classifier:3", "penguins", scoring="script", dry_run=True)
    endpoint, deployment = dry_run_entities(tmp_path, text, "online")
    assert yaml.safe_load(text.split("---\n")[1])["code_configuration"]["code"] == "."  # for deployment.yml at the root
    assert deployment.code_configuration.scoring_script == "scripts/score.py"
    assert deployment.environment_variables == {"WORKER_COUNT": "1"}
    conda = yaml.safe_load((REPO / "scripts/serving/environment.yml").read_text())
    assert deployment.environment.conda_file == conda  # the environment `make serve` runs
    assert deployment.environment.image == "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04:latest"


def test_yaml_dir_writes_both_files_for_az_ml_run_from_anywhere(tmp_path, capsys, monkeypatch):
    from azure.ai.ml import load_online_deployment, load_online_endpoint

    main(["online", "penguins-classifier:1", "--endpoint", "penguins", "--scoring", "script", "--dry_run", "true",
          "--yaml_dir", str(tmp_path / "deploy")])  # fmt: skip
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'deploy' / 'endpoint.yml'} and ")
    assert load_online_endpoint(tmp_path / "deploy" / "endpoint.yml").auth_mode == "key"
    monkeypatch.chdir(tmp_path)  # `az ml online-deployment create -f deploy/deployment.yml` from another folder
    deployment = load_online_deployment(tmp_path / "deploy" / "deployment.yml")
    assert (tmp_path / "deploy" / deployment.code_configuration.code).resolve() == REPO
    assert deployment.code_configuration.scoring_script == "scripts/score.py"


def test_yaml_dir_rewrites_its_own_files_but_never_a_file_of_the_users(tmp_path, capsys):
    args = ["online", "penguins-classifier:1", "--dry_run", "true", "--yaml_dir", str(tmp_path), "--endpoint"]
    main([*args, "penguins"])
    main([*args, "pen2"])  # a dry run again, another endpoint: its own two files are replaced
    assert yaml.safe_load((tmp_path / "endpoint.yml").read_text())["name"] == "pen2"
    (tmp_path / "deployment.yml").write_text("# my notes on the deployment\n")
    with pytest.raises(SystemExit) as exit:
        main([*args, "penguins"])
    assert str(exit.value) == (
        f"error: --yaml_dir {tmp_path}: {tmp_path / 'deployment.yml'} is there and is not a deployment's YAML, and it "
        "would be written over; give another folder"
    )
    assert (tmp_path / "deployment.yml").read_text() == "# my notes on the deployment\n"
    assert yaml.safe_load((tmp_path / "endpoint.yml").read_text())["name"] == "pen2"  # nothing written


def test_deploy_creates_the_endpoint_then_the_model_alone_then_gives_it_all_traffic(monkeypatch, capsys):
    azure = FakeEndpoints()
    client = fake_client(azure)
    monkeypatch.setattr("scripts.deploy.workspace_client", lambda *ids: client)
    assert online("penguins-classifier:1", "penguins", instance_type="Standard_DS2_v2") == SCORING_URI
    puts = [path.rsplit("/ws", 1)[1] for method, path, _ in azure.requests if method == "PUT"]
    endpoint = "/onlineEndpoints/penguins"
    assert puts == [endpoint, f"{endpoint}/deployments/blue", endpoint]
    first, last = azure.sent("PUT", r"/onlineEndpoints/penguins$")
    assert (first["properties"]["authMode"], first["properties"]["traffic"]) == ("Key", {})
    assert last["properties"]["traffic"] == {"blue": 100}
    (deployment,) = azure.sent("PUT", r"/deployments/blue$")
    properties = deployment["properties"]
    assert properties["model"] == f"{WORKSPACE}/models/penguins-classifier/versions/1"
    assert "codeConfiguration" not in properties and "environmentId" not in properties  # no code, no environment
    assert azure.code_hashes == []  # nothing of this folder asked for or uploaded
    assert (properties["instanceType"], deployment["sku"]["capacity"]) == ("Standard_DS2_v2", 1)
    assert properties["environmentVariables"] == {"WORKER_COUNT": "1"}
    out = capsys.readouterr().out
    assert f"deployment blue takes all traffic of {SCORING_URI}" in out
    assert "az ml online-endpoint get-credentials -n penguins" in out


def test_a_new_deployment_leaves_a_live_endpoints_traffic_where_it_is_until_it_is_ready(monkeypatch, capsys):
    """Azure ML takes an endpoint put without its traffic (online) or default deployment (batch) as none: the
    deployments serving now would answer nothing while the new one provisions, and for good if it fails."""
    azure = FakeEndpoints()
    client = fake_client(azure)
    monkeypatch.setattr("scripts.deploy.workspace_client", lambda *ids: client)
    online("penguins-classifier:1", "penguins")
    batch("penguins-classifier:1", "penguins-rows", "tabular", "cpu-cluster")
    azure.requests.clear()
    online("penguins-classifier:2", "penguins", deployment="green")
    batch("penguins-classifier:2", "penguins-rows", "tabular", "cpu-cluster", deployment="second")
    first, last = azure.sent("PUT", r"/onlineEndpoints/penguins$")
    assert (first["properties"]["traffic"], last["properties"]["traffic"]) == ({"blue": 100}, {"green": 100})
    first, last = azure.sent("PUT", r"/batchEndpoints/penguins-rows$")
    assert first["properties"]["defaults"] == {"deploymentName": "default"}
    assert last["properties"]["defaults"] == {"deploymentName": "second"}


def test_the_deployment_given_all_traffic_stops_taking_mirrored_traffic(monkeypatch, capsys):
    """A deployment shadowing the live one (mirror traffic) and then deployed again takes all live traffic: Azure ML
    refuses an endpoint that also mirrors to it, so its mirror share ends with the switch; the others' stay."""
    azure = FakeEndpoints()
    client = fake_client(azure)
    monkeypatch.setattr("scripts.deploy.workspace_client", lambda *ids: client)
    online("penguins-classifier:1", "penguins")
    online("penguins-classifier:2", "penguins", deployment="green")
    endpoint = next(value for key, value in azure.resources.items() if key.endswith("/onlineEndpoints/penguins"))
    endpoint["properties"] |= {"traffic": {"blue": 100, "green": 0}, "mirrorTraffic": {"green": 10}}
    azure.requests.clear()
    capsys.readouterr()
    online("penguins-classifier:3", "penguins", deployment="green")
    first, last = azure.sent("PUT", r"/onlineEndpoints/penguins$")
    assert (first["properties"]["traffic"]["blue"], first["properties"]["mirrorTraffic"]) == (100, {"green": 10})
    assert last["properties"]["traffic"] == {"green": 100} and not last["properties"].get("mirrorTraffic")
    out = capsys.readouterr().out
    assert "deployment green takes no more mirrored traffic: it takes the live traffic" in out
    assert "deployment green takes all traffic" in out


def test_a_new_deployment_keeps_the_endpoints_auth_mode_unless_one_is_given(monkeypatch, capsys):
    """--auth_mode left out is the live endpoint's own: its callers' tokens (or keys) go on working."""
    azure = FakeEndpoints()
    client = fake_client(azure)
    monkeypatch.setattr("scripts.deploy.workspace_client", lambda *ids: client)
    online("penguins-classifier:1", "penguins", auth_mode="aml_token")
    azure.requests.clear()
    capsys.readouterr()
    online("penguins-classifier:2", "penguins", deployment="green")
    puts = azure.sent("PUT", r"/onlineEndpoints/penguins$")
    assert [put["properties"]["authMode"] for put in puts] == ["AMLToken", "AMLToken"]
    assert "az ml online-endpoint get-credentials (an aml_token) -n penguins" in capsys.readouterr().out
    azure.requests.clear()
    online("penguins-classifier:3", "penguins", auth_mode="key")  # asked for: the endpoint's is changed
    assert azure.sent("PUT", r"/onlineEndpoints/penguins$")[0]["properties"]["authMode"] == "Key"


@pytest.mark.slow
def test_deploy_with_the_scoring_script_uploads_this_folder_and_builds_the_serving_environment(monkeypatch, capsys):
    from azure.ai.ml._utils._asset_utils import get_content_hash, get_ignore_file

    from scripts.azure_ml.code_snapshot import code_snapshot

    azure = FakeEndpoints()
    client = fake_client(azure)
    monkeypatch.setattr("scripts.deploy.workspace_client", lambda *ids: client)
    assert online("penguins-classifier:1", "penguins", scoring="script") == SCORING_URI
    (deployment,) = azure.sent("PUT", r"/deployments/blue$")
    properties = deployment["properties"]
    assert properties["codeConfiguration"]["scoringScript"] == "scripts/score.py"
    assert properties["codeConfiguration"]["codeId"].startswith(f"{WORKSPACE}/codes/")
    # The code snapshot asked for is this folder's: its snapshot's hash, which tests/azure/test_code_snapshot.py shows
    # is the SDK's own hash of the folder (that walk reads .venv's every file: ~11 s of CPU).
    with code_snapshot(REPO) as code:
        assert azure.code_hashes == [get_content_hash(code, get_ignore_file(code))]
    assert properties["environmentVariables"] == {"WORKER_COUNT": "1"}
    (environment,) = azure.sent("PUT", r"/environments/")
    conda = yaml.safe_load(environment["properties"]["condaFile"])
    assert conda == yaml.safe_load((REPO / "scripts/serving/environment.yml").read_text())
    assert azure.sent("PUT", r"/onlineEndpoints/penguins$")[-1]["properties"]["traffic"] == {"blue": 100}


def test_a_deployment_without_an_azure_login_is_one_line(monkeypatch):
    from azure.core.exceptions import ClientAuthenticationError

    class NoLogin(FakeCredential):
        def get_token(self, *scopes, **options):
            raise ClientAuthenticationError("DefaultAzureCredential failed to retrieve a token")

        get_token_info = get_token

    client = fake_client(FakeEndpoints(), NoLogin())
    monkeypatch.setattr("scripts.deploy.workspace_client", lambda *ids: client)
    with pytest.raises(SystemExit) as exit:
        main(["online", "penguins-classifier:1", "--endpoint", "penguins"])
    assert str(exit.value.code).startswith("error: not signed in to Azure: run `az login`")


@pytest.mark.parametrize("kind", ["online", "batch"])
def test_a_model_version_the_workspace_lacks_is_one_line_before_anything_is_created(monkeypatch, kind):
    azure = FakeEndpoints()
    client = fake_client(azure)
    monkeypatch.setattr("scripts.deploy.workspace_client", lambda *ids: client)
    batch_args = ["--inputs", "tabular", "--compute", "cpu-cluster"] if kind == "batch" else []
    with pytest.raises(SystemExit) as exit:
        main([kind, "penguins-classifier:7", "--endpoint", "penguins", *batch_args])
    assert exit.value.code == (
        "error: model penguins-classifier:7 is not registered in this workspace; nothing was created. Its versions: "
        "az ml model list --name penguins-classifier"
    )
    assert [method for method, *_ in azure.requests if method != "GET"] == []  # no endpoint, no environment


def test_a_batch_deployment_of_more_nodes_than_its_cluster_scales_to_is_one_line_before_anything_is_created(
    monkeypatch,
):
    """Its scoring jobs would wait for nodes the cluster never has. Online deployments name no cluster (Azure ML's
    managed VMs): their --instance_count is not asked of the workspace."""
    azure = FakeEndpoints()
    client = fake_client(azure)
    monkeypatch.setattr("scripts.deploy.workspace_client", lambda *ids: client)
    with pytest.raises(SystemExit) as exit:
        main(["batch", "birds-classifier:2", "--endpoint", "birds-batch", "--inputs", "images",
              "--compute", "azureml:cpu-cluster", "--instance_count", "5"])  # fmt: skip
    assert exit.value.code == (
        "error: --instance_count 5: the cluster cpu-cluster scales to at most 4 nodes; give 4 or fewer, or raise its "
        "maximum (az ml compute update --name cpu-cluster --max-instances 5)"
    )
    assert [method for method, *_ in azure.requests] == ["GET"] and azure.code_hashes == []


def test_a_batch_deployment_of_tabular_files_is_the_mlflow_model_alone(tmp_path, capsys):
    text = batch("penguins-classifier:1", "penguins-batch", "tabular", "cpu-cluster", instance_count=2,
                 mini_batch_size=4, dry_run=True)  # fmt: skip
    endpoint, deployment = dry_run_entities(tmp_path, text, "batch")
    assert endpoint.name == "penguins-batch"
    assert (deployment.name, deployment.endpoint_name, deployment.type) == ("default", "penguins-batch", "model")
    assert deployment.model == "penguins-classifier:1" and deployment.compute == "cpu-cluster"
    assert deployment.code_configuration is None and deployment.environment is None  # Azure ML's MLflow batch driver
    settings = deployment.settings
    assert (deployment.resources.instance_count, settings.mini_batch_size, settings.max_concurrency_per_instance) == (
        2,
        4,
        1,
    )
    assert (settings.output_action, settings.output_file_name) == ("append_row", "predictions.csv")


def test_a_batch_deployment_of_images_runs_batch_score_over_the_model_in_the_serving_environment(tmp_path, capsys):
    text = batch("birds-classifier:2", "birds-batch", "images", "gpu-cluster", max_concurrency_per_instance=2,
                 dry_run=True)  # fmt: skip
    endpoint, deployment = dry_run_entities(tmp_path, text, "batch")
    assert deployment.model == "birds-classifier:2"
    assert deployment.code_configuration.scoring_script == "scripts/serving/batch_score.py"
    assert yaml.safe_load(text.split("---\n")[1])["code_configuration"]["code"] == "."
    conda = yaml.safe_load((REPO / "scripts/serving/environment.yml").read_text())
    pip = lambda conda: next(item["pip"] for item in conda["dependencies"] if isinstance(item, dict))  # noqa: E731
    # Azure ML's batch driver runs the scoring script under azureml-core (Azure's batch examples install it); pyarrow
    # reads the Parquet files the script scores (the serving environment has none).
    assert pip(deployment.environment.conda_file) == [*pip(conda), "azureml-core==1.61.0.post4", "pyarrow==25.0.1"]
    assert deployment.settings.max_concurrency_per_instance == 2


@pytest.mark.parametrize("inputs", ["tabular", "images"])
def test_batch_creates_the_endpoint_then_the_deployment_then_makes_it_the_default(monkeypatch, capsys, inputs):
    azure = FakeEndpoints()
    client = fake_client(azure)
    monkeypatch.setattr("scripts.deploy.workspace_client", lambda *ids: client)
    assert batch("birds-classifier:2", "birds-batch", inputs, "azureml:cpu-cluster", deployment="onnx") == BATCH_URI
    puts = [path.rsplit("/ws", 1)[1] for method, path, _ in azure.requests if method == "PUT"]
    environments = ["/environments/"] if inputs == "images" else []
    assert [path if "/environments/" not in path else "/environments/" for path in puts] == [
        "/batchEndpoints/birds-batch", *environments, "/batchEndpoints/birds-batch/deployments/onnx",
        "/batchEndpoints/birds-batch",
    ]  # fmt: skip
    first, last = azure.sent("PUT", r"/batchEndpoints/birds-batch$")
    assert "defaults" not in first["properties"] and last["properties"]["defaults"] == {"deploymentName": "onnx"}
    (deployment,) = azure.sent("PUT", r"/deployments/onnx$")
    properties = deployment["properties"]
    assert properties["model"]["assetId"] == f"{WORKSPACE}/models/birds-classifier/versions/2"
    assert properties["compute"].endswith("/computes/cpu-cluster")
    assert (properties["outputAction"], properties["outputFileName"]) == ("AppendRow", "predictions.csv")
    if inputs == "images":
        assert properties["codeConfiguration"]["scoringScript"] == "scripts/serving/batch_score.py"
        assert len(azure.code_hashes) == 1
    else:
        assert "codeConfiguration" not in properties and "environmentId" not in properties
        assert azure.code_hashes == []
    out = capsys.readouterr().out
    assert f"deployment onnx is the default of {BATCH_URI}" in out
    assert "az ml batch-endpoint invoke -n birds-batch --input PATH --input-type uri_folder" in out


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["online", "penguins-classifier", "--endpoint", "p1n"], "model 'penguins-classifier': give a registered"),
        (["online", "m:1", "--endpoint", "1penguins"], "--endpoint '1penguins': 3-32 letters, digits and hyphens"),
        (["online", "m:1"], "--endpoint '': 3-32 letters"),
        (["online", "m:1", "--endpoint", "pen", "--deployment", "blue-"], "--deployment 'blue-': 3-32 letters"),
        (["online", "m:1", "--endpoint", "pen", "--instance_type", "DS3"], "--instance_type 'DS3': give an Azure VM"),
        (["online", "m:1", "--endpoint", "pen", "--instance_count", "0"], "--instance_count, --workers and"),
        (
            ["online", "m:1", "--endpoint", "pen", "--request_timeout_ms", "180001", "--dry_run", "true"],
            "--request_timeout_ms 180001: Azure ML's managed online endpoints take 180000 (3 minutes) at most; give "
            "180000 or less",
        ),
        (["online", "m:1", "--endpoint", "pen", "--auth_mode", "none"], "--auth_mode: 'none' is not a valid value"),
        (["online", "m:1", "--endpoint", "pen", "--yaml_dir", "d"], "--yaml_dir writes the YAML instead of deploying"),
        (["online", "m:1", "--endpoint", "pen", "--workspace", "ws"], "name the workspace with all three of"),
        (
            ["online", "m:1", "--endpoint", "pen", "--dry_run", "true", "--yaml_dir", "README.md"],
            "--yaml_dir README.md: README.md is a file, not a folder; give a folder, e.g. deploy/",
        ),
        (
            [
                "batch",
                "m:1",
                "--endpoint=pen",
                "--inputs=images",
                "--compute=c",
                "--dry_run=true",
                "--yaml_dir=README.md/d",
            ],
            "--yaml_dir README.md/d: README.md is a file, not a folder",
        ),
        (
            ["online", "m:1", "--endpoint", "pen", "--scoring", "script", "--environment", "serving"],
            "--environment 'serving': give a regis",
        ),
        (["online", "m:1", "--endpoint", "pen", "--environment", "azureml:s:1"], "--environment is for --scoring scr"),
        (["online", "m:1", "--endpoint", "pen", "--backend", "torch"], "unrecognized arguments: --backend torch"),
        (["online", "m:1", "--endpoint", "pen", "--scoring", "code"], "--scoring: 'code' is not a valid value"),
        (["batch", "m:1", "--endpoint", "pen", "--compute", "c"], "say what the endpoint scores: --inputs tabular"),
        (["batch", "m:1", "--endpoint", "pen", "--inputs", "images"], "give the compute cluster the scoring jobs"),
        (
            ["batch", "m:1", "--endpoint", "pen", "--inputs", "images", "--compute", "serverless"],
            "--compute serverless: a batch deployment's scoring jobs run on a compute cluster of the workspace; give "
            "its name, e.g. cpu-cluster",
        ),
        (
            ["batch", "m:1", "--endpoint", "pen", "--inputs", "images", "--compute", "cpu cluster"],
            "--compute 'cpu cluster': not a compute's name; give a cluster's name (letters, digits and hyphens, e.g. "
            "cpu-cluster)",
        ),
        (["batch", "m:1", "--inputs", "images", "--compute", "c"], "--endpoint '': 3-32 letters"),
        (["batch", "m:1", "--endpoint", "pen", "--inputs", "rows", "--compute", "c"], "--inputs: 'rows' is not a"),
        (
            ["batch", "m:1", "--endpoint", "pen", "--inputs", "images", "--compute", "c", "--mini_batch_size", "0"],
            "--instance_count, --mini_batch_size and --max_concurrency_per_instance must be 1 or more",
        ),
        (
            [
                "batch",
                "m:1",
                "--endpoint",
                "pen",
                "--inputs",
                "tabular",
                "--compute",
                "c",
                "--environment",
                "azureml:s:1",
            ],
            "--environment is for --inputs images",
        ),
        (
            ["online", "m:1", "--endpoint", "pen", "--instance_type", "Standard_NC4as_T4_v3"],
            "--instance_type Standard_NC4as_T4_v3: a GPU size, but the model scores on CPUs",
        ),
        (
            ["online", "m:1", "--endpoint", "pen", "--instance_type", "Standard_ND96asr_v4", "--dry_run", "true"],
            "--instance_type Standard_ND96asr_v4: a GPU size",
        ),
        (
            ["online", "m:1", "--endpoint=pen", "--scoring=script", "--environment=azureml:lightning-training:1"],
            "--environment azureml:lightning-training:1: the training environment (environment.yml), which has no "
            "Azure ML inference server to serve the model; give the serving one, e.g. azureml:lightning-serving:1 "
            "(python -m scripts.assets environment serving)",
        ),
        (
            [
                "batch",
                "m:1",
                "--endpoint=pen",
                "--inputs=images",
                "--compute=c",
                "--environment=lightning-training-gpu:2",
            ],
            "--environment lightning-training-gpu:2: the training-gpu environment (environment.yml), which has no",
        ),
        (
            [
                "online",
                "m:1",
                "--endpoint=pen",
                "--instance_type=Standard_NC4as_T4_v3",
                "--scoring=script",
                "--environment=azureml:lightning-serving:1",
            ],
            "--instance_type Standard_NC4as_T4_v3: a GPU size, but the model scores on CPUs",
        ),
    ],
)
def test_a_mistake_is_one_line_before_the_azure_sdk_is_imported(args, line):
    command = [sys.executable, "-X", "importtime", "-m", "scripts.deploy", *args]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    messages = [text for text in result.stderr.splitlines() if not text.startswith("import time:")]
    assert len(messages) == 1 and messages[0].startswith(f"error: {line}"), messages
    imported = [text.rsplit("|", 1)[-1].strip() for text in result.stderr.splitlines() if text.startswith("import")]
    assert not [name for name in imported if name.startswith("azure")]


def test_a_registered_serving_environment_is_named_not_built(tmp_path, capsys):
    text = online("penguins-classifier:1", "penguins", scoring="script", environment="azureml:lightning-serving:2",
                  dry_run=True)  # fmt: skip
    _, deployment = dry_run_entities(tmp_path, text, "online")
    assert deployment.environment.endswith("lightning-serving:2")  # no conda file: nothing to build
    text = batch("birds-classifier:1", "birds-batch", "images", "cpu", environment="lightning-serving:2", dry_run=True)
    _, deployment = dry_run_entities(tmp_path, text, "batch")
    assert yaml.safe_load(text.split("---\n")[1])["environment"] == "azureml:lightning-serving:2"


def test_a_gpu_instance_type_is_taken_with_a_registered_environment(capsys):
    """A registered serving environment may be built for GPUs: only the model's own (CPU) requirements are known."""
    from scripts.deploy import online

    text = online("penguins-classifier:1", "penguins", instance_type="Standard_NC4as_T4_v3", scoring="script",
                  environment="azureml:lightning-serving-gpu:1", dry_run=True)  # fmt: skip
    deployment = yaml.safe_load(text.split("---\n")[1])
    assert deployment["instance_type"] == "Standard_NC4as_T4_v3"
