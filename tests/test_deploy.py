"""scripts.deploy: the managed online endpoint and deployment of a registered model, and the batch scoring job, checked
offline by the real azure-ai-ml objects: the YAML `az ml` takes through load_online_endpoint / load_online_deployment /
load_job, and a deployment through MLClient over the fake HTTP transport of tests/test_submit.py, grown the routes of
online endpoints."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import yaml

from scripts.deploy import batch, main, online
from tests.conftest import REPO
from tests.fake_azure import WORKSPACE, FakeAzureML, FakeCredential, fake_client, http_response

SCORING_URI = "https://penguins.westeurope.inference.ml.azure.com/score"


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)  # the deployment's code is this folder


class FakeOnlineEndpoints(FakeAzureML):
    """FakeAzureML with Azure ML's online endpoint and deployment routes: a PUT is provisioned at once (a finished
    long-running operation), GET returns what was put, with what the service adds (scoring URI, scale settings)."""

    def __init__(self) -> None:
        super().__init__()
        self.resources: dict[str, dict] = {}

    def request(self, method, url, data=None, **kwargs):
        path = url.split("?")[0].removeprefix("https://management.azure.com")
        resource = re.search(r"/onlineEndpoints/[^/]+(/deployments/[^/]+)?$", path)
        if resource and method in ("PUT", "GET"):
            sent = json.loads(data) if data else None
            self.requests.append((method, path, sent))
            if method == "PUT":
                answer = {"id": path, "name": path.rsplit("/", 1)[1], **sent}
                answer["properties"] = {**answer["properties"], "provisioningState": "Succeeded"}
                if resource.group(1):
                    answer["properties"]["scaleSettings"] = {"scaleType": "Default"}
                else:
                    answer["properties"]["scoringUri"] = SCORING_URI
                self.resources[path] = answer
            if path not in self.resources:
                return http_response(method, url, 404, b'{"error": {"code": "NotFound", "message": "no such"}}')
            return self.json(method, url, self.resources[path])
        if method == "GET" and re.search(r"/onlineEndpoints/[^/]+/deployments$", path):
            self.requests.append((method, path, None))
            return self.json(method, url, {"value": [v for k, v in self.resources.items() if k.startswith(path)]})
        return super().request(method, url, data, **kwargs)

    @staticmethod
    def json(method, url, answer):
        return http_response(method, url, 200, json.dumps(answer).encode(), {"Content-Type": "application/json"})

    def sent(self, method: str, pattern: str) -> list[dict]:
        return [body for m, path, body in self.requests if m == method and re.search(pattern, path)]


def test_dry_run_prints_the_endpoint_and_deployment_yaml_that_az_ml_loads_back(tmp_path, capsys):
    from azure.ai.ml import load_online_deployment, load_online_endpoint

    text = online("models:/penguins-classifier/3", "penguins", "green", "Standard_F4s_v2", 2, "aml_token", "torch",
                  workers=2, dry_run=True)  # fmt: skip
    printed = capsys.readouterr().out
    assert printed.startswith("# endpoint.yml\n") and "---\n# deployment.yml\n" in printed
    endpoint_text, deployment_text = text.split("---\n")
    (tmp_path / "endpoint.yml").write_text(endpoint_text)
    (tmp_path / "deployment.yml").write_text(deployment_text)
    endpoint = load_online_endpoint(tmp_path / "endpoint.yml")
    assert (endpoint.name, endpoint.auth_mode) == ("penguins", "aml_token")
    assert yaml.safe_load(deployment_text)["code_configuration"]["code"] == "."  # for deployment.yml at the root
    deployment = load_online_deployment(tmp_path / "deployment.yml")
    assert (deployment.name, deployment.endpoint_name) == ("green", "penguins")
    assert deployment.model == "penguins-classifier:3"  # of the workspace's registry, where --register_model puts it
    assert (deployment.instance_type, deployment.instance_count) == ("Standard_F4s_v2", 2)
    assert deployment.code_configuration.scoring_script == "scripts/score.py"
    assert deployment.environment_variables == {"SCORE_BACKEND": "torch", "WORKER_COUNT": "2"}
    assert deployment.request_settings.max_concurrent_requests_per_instance == 2
    conda = yaml.safe_load((REPO / "scripts/serving/environment.yml").read_text())
    assert deployment.environment.conda_file == conda  # the environment `make serve` runs
    assert deployment.environment.image == "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04:latest"


def test_yaml_dir_writes_both_files_for_az_ml_run_from_anywhere(tmp_path, capsys, monkeypatch):
    from azure.ai.ml import load_online_deployment, load_online_endpoint

    main(["online", "penguins-classifier:1", "--endpoint", "penguins", "--dry_run", "true",
          "--yaml_dir", str(tmp_path / "deploy")])  # fmt: skip
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'deploy' / 'endpoint.yml'} and ")
    assert load_online_endpoint(tmp_path / "deploy" / "endpoint.yml").auth_mode == "key"
    monkeypatch.chdir(tmp_path)  # `az ml online-deployment create -f deploy/deployment.yml` from another folder
    deployment = load_online_deployment(tmp_path / "deploy" / "deployment.yml")
    assert (tmp_path / "deploy" / deployment.code_configuration.code).resolve() == REPO
    assert deployment.environment_variables["SCORE_BACKEND"] == "onnxruntime"


@pytest.mark.slow
def test_deploy_creates_the_endpoint_then_the_deployment_then_gives_it_all_traffic(monkeypatch, capsys):
    from azure.ai.ml._utils._asset_utils import get_content_hash, get_ignore_file

    azure = FakeOnlineEndpoints()
    client = fake_client(azure)
    monkeypatch.setattr("scripts.deploy.workspace_client", lambda *ids: client)
    assert online("penguins-classifier:1", "penguins", instance_type="Standard_DS2_v2") == SCORING_URI
    puts = [path.rsplit("/ws", 1)[1] for method, path, _ in azure.requests if method == "PUT"]
    assert puts[0] == "/onlineEndpoints/penguins" and puts[-2:] == [
        "/onlineEndpoints/penguins/deployments/blue", "/onlineEndpoints/penguins"
    ]  # fmt: skip
    first, last = azure.sent("PUT", r"/onlineEndpoints/penguins$")
    assert (first["properties"]["authMode"], first["properties"]["traffic"]) == ("Key", {})
    assert last["properties"]["traffic"] == {"blue": 100}
    (deployment,) = azure.sent("PUT", r"/deployments/blue$")
    properties = deployment["properties"]
    assert properties["model"] == f"{WORKSPACE}/models/penguins-classifier/versions/1"
    assert properties["codeConfiguration"]["scoringScript"] == "scripts/score.py"
    assert properties["codeConfiguration"]["codeId"].startswith(f"{WORKSPACE}/codes/")
    # The code snapshot asked for is this folder's, as the SDK's own walk of it would hash it.
    assert azure.code_hashes == [get_content_hash(REPO, get_ignore_file(REPO))]
    assert (properties["instanceType"], deployment["sku"]["capacity"]) == ("Standard_DS2_v2", 1)
    assert properties["environmentVariables"] == {"SCORE_BACKEND": "onnxruntime", "WORKER_COUNT": "1"}
    (environment,) = azure.sent("PUT", r"/environments/")
    conda = yaml.safe_load(environment["properties"]["condaFile"])
    assert conda == yaml.safe_load((REPO / "scripts/serving/environment.yml").read_text())
    out = capsys.readouterr().out
    assert f"deployment blue takes all traffic of {SCORING_URI}" in out
    assert "az ml online-endpoint get-credentials -n penguins" in out


def test_a_deployment_without_an_azure_login_is_one_line(monkeypatch):
    from azure.core.exceptions import ClientAuthenticationError

    class NoLogin(FakeCredential):
        def get_token(self, *scopes, **options):
            raise ClientAuthenticationError("DefaultAzureCredential failed to retrieve a token")

        get_token_info = get_token

    client = fake_client(FakeOnlineEndpoints(), NoLogin())
    monkeypatch.setattr("scripts.deploy.workspace_client", lambda *ids: client)
    with pytest.raises(SystemExit) as exit:
        main(["online", "penguins-classifier:1", "--endpoint", "penguins"])
    assert str(exit.value.code).startswith("error: not signed in to Azure: run `az login`")


def test_batch_scoring_is_the_scoring_code_as_a_command_job(tmp_path, capsys):
    from azure.ai.ml import load_job

    (tmp_path / "photos").mkdir()
    text = batch("birds-classifier:2", str(tmp_path / "photos"), "cpu-cluster", "torch", dry_run=True)
    (tmp_path / "job.yml").write_text(text)
    job = load_job(tmp_path / "job.yml")
    assert job.command == (
        "python -m scripts.score ${{inputs.model}} ${{inputs.data}} --backend torch --output ${{outputs.predictions}}"
    )
    assert job.inputs["model"].type == "mlflow_model" and job.inputs["model"].path.endswith("birds-classifier:2")
    assert job.inputs["data"].type == "uri_folder"
    assert (REPO / job.inputs["data"].path).resolve() == tmp_path / "photos"  # relative to job.yml at the root
    assert job.compute == "cpu-cluster" and job.outputs["predictions"].type == "uri_folder"
    conda = yaml.safe_load((REPO / "scripts/serving/environment.yml").read_text())
    assert job.environment.conda_file == conda
    text = batch("penguins-classifier:1", "azureml://datastores/blob/paths/new.csv", "c", dry_run=True)
    assert yaml.safe_load(text)["inputs"]["data"]["type"] == "uri_file"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["online", "penguins-classifier", "--endpoint", "p1n"], "model 'penguins-classifier': give a registered"),
        (["online", "m:1", "--endpoint", "1penguins"], "--endpoint '1penguins': 3-32 letters, digits and hyphens"),
        (["online", "m:1"], "--endpoint '': 3-32 letters"),
        (["online", "m:1", "--endpoint", "pen", "--deployment", "blue-"], "--deployment 'blue-': 3-32 letters"),
        (["online", "m:1", "--endpoint", "pen", "--instance_type", "DS3"], "--instance_type 'DS3': give an Azure VM"),
        (["online", "m:1", "--endpoint", "pen", "--instance_count", "0"], "--instance_count, --workers and"),
        (["online", "m:1", "--endpoint", "pen", "--auth_mode", "none"], "--auth_mode: 'none' is not a valid value"),
        (["online", "m:1", "--endpoint", "pen", "--yaml_dir", "d"], "--yaml_dir writes the YAML instead of deploying"),
        (["online", "m:1", "--endpoint", "pen", "--workspace", "ws"], "name the workspace with all three of"),
        (["batch", "m:1", "no/such/photos", "--compute", "c"], "no/such/photos: no such file or folder"),
        (["batch", "m:1", "configs", "--dry_run", "true"], "give the compute cluster to run on: --compute NAME"),
        (["online", "m:1", "--endpoint", "pen", "--environment", "serving"], "--environment 'serving': give a regis"),
        (
            ["online", "m:1", "--endpoint", "pen", "--instance_type", "Standard_NC4as_T4_v3"],
            "--instance_type Standard_NC4as_T4_v3: a GPU size, but the serving environment",
        ),
        (
            ["online", "m:1", "--endpoint", "pen", "--instance_type", "Standard_ND96asr_v4", "--dry_run", "true"],
            "--instance_type Standard_ND96asr_v4: a GPU size",
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


def test_a_registered_serving_environment_and_data_asset_are_named_not_built(tmp_path, capsys):
    from azure.ai.ml import load_job, load_online_deployment

    text = online("penguins-classifier:1", "penguins", environment="azureml:lightning-serving:2", dry_run=True)
    (tmp_path / "deployment.yml").write_text(text.split("---\n")[1])
    deployment = load_online_deployment(tmp_path / "deployment.yml")
    assert deployment.environment.endswith("lightning-serving:2")  # no conda file: nothing to build
    text = batch("penguins-classifier:1", "azureml:penguins:3", "cpu", data_type="uri_file",
                 environment="lightning-serving:2", dry_run=True)  # fmt: skip
    (tmp_path / "job.yml").write_text(text)
    job = load_job(tmp_path / "job.yml")
    assert job.inputs["data"].type == "uri_file" and job.inputs["data"].path.endswith("penguins:3")
    assert yaml.safe_load(text)["environment"] == "azureml:lightning-serving:2"


def test_a_gpu_instance_type_is_taken_with_a_registered_environment(capsys):
    """A registered serving environment may be built for GPUs: only the default one is known to score on CPUs."""
    from scripts.deploy import online

    text = online("penguins-classifier:1", "penguins", instance_type="Standard_NC4as_T4_v3",
                  environment="azureml:lightning-serving-gpu:1", dry_run=True)  # fmt: skip
    deployment = yaml.safe_load(text.split("---\n")[1])
    assert deployment["instance_type"] == "Standard_NC4as_T4_v3"
