"""Azure ML's inference server (`azmlinfsrv`, PyPI's azureml-inference-server-http) listening on one address.

    .venv-serve/bin/python -m scripts.serving.inference_server --host 127.0.0.1 --entry_script scripts/score.py \\
        --model_dir outputs/serving/penguins-classifier-1 --port 5001

Runs in the serving environment (.venv-serve, `make serve-env`); `make serve` / `python -m scripts.serve` start it.
Every option but --host is azmlinfsrv's own. azmlinfsrv binds 0.0.0.0, every interface, as it should inside a
container; on a laptop that would serve the model, without any key, to the whole network. It has no option for the
address, so this sets the module constant it binds to (DEFAULT_HOST; tests/serving/test_serve.py checks that the server
listens where asked) and then runs azmlinfsrv exactly as its console script does.
"""

from __future__ import annotations

import os
import sys

GRACE_S = 3  # what a request is given to finish after SIGTERM: answers take well under a second


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    host = "127.0.0.1"
    if "--host" in argv:
        index = argv.index("--host")
        host = argv[index + 1]
        del argv[index : index + 2]
    from azureml_inference_server_http import amlserver

    if not hasattr(amlserver, "DEFAULT_HOST"):
        sys.exit("error: azureml-inference-server-http has no DEFAULT_HOST: install scripts/serving/environment.yml's")
    amlserver.DEFAULT_HOST = host
    # gunicorn 27 opens a control socket at one path per user (~/.gunicorn/gunicorn.ctl): two servers would share it.
    # SIGTERM (what `kill` and a container's stop send) waits graceful-timeout for workers, which finish loading the
    # model first (gunicorn's default: 30 s): GRACE_S here, then they are killed. What the user sets comes after.
    given = os.environ.get("GUNICORN_CMD_ARGS", "")
    os.environ["GUNICORN_CMD_ARGS"] = f"--no-control-socket --graceful-timeout {GRACE_S} {given}".strip()
    sys.argv = ["azmlinfsrv", *argv]
    amlserver.run()


if __name__ == "__main__":
    main()
