# Every verb a user types. `make train` and `make test` set up .venv themselves the first time.
#   make train                          # penguins: fit 100 epochs, test the best checkpoint
#   make train TASK=mnist ARGS="--trainer.max_epochs 2"
#   make predict INPUT=my_penguins.csv  # the newest best checkpoint of this data unless CKPT=...
# The core's targets come first; each extra's (pyproject.toml's extras) sit in a block of their own, which
# `make drop EXTRA=<name>` removes with the extra.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
TASK ?= penguins
CONFIG ?= configs/$(TASK).yaml
ARGS ?=
# The checkpoint validate, evaluate, predict, export and serve use: CKPT, else the newest best checkpoint of a run
# trained on the data CONFIG and FIT_ARGS name (its recorded config.yaml: scripts/checkpoint_of.py), else one line
# listing the runs to choose from. FIT_ARGS: the fit's --data.* options (default: ARGS), e.g. for export and serve,
# whose ARGS are their own: make export TASK=birds FIT_ARGS="--data.init_args.data_dir photos/".
CKPT ?=
FIT_ARGS ?= $(ARGS)
FIND_CKPT = ckpt="$(CKPT)"; test -n "$$ckpt" || ckpt=$$($(PY) -m scripts.checkpoint_of --config "$(CONFIG)" $(FIT_ARGS)) \
	|| exit 1
# What predict classifies; the penguin task has an example CSV, image tasks need INPUT=folder/.
INPUT ?= $(if $(filter penguins,$(TASK)),configs/examples/penguins.csv,)
RUN ?=
MLFLOW_PORT ?= 5000
MLFLOW_STORE ?= outputs/mlflow.db
MLFLOW_JOBS ?= false
# Server processes of `make mlflow-ui`: one answers one person's browser. MLflow's default, 4, starts four, each
# importing MLflow: more CPU to start and more memory (docs/measured.md).
MLFLOW_WORKERS ?= 1
MNIST_DIR ?= data/mnist
# The core alone (pyproject's `dependencies`, no extra): tests/test_core.py fits, tests and predicts every task in it.
CORE_VENV ?= .venv-core
# pytest-xdist workers of `make test`: three on CI's 2 cores. Each test process runs one torch thread
# (tests/__init__.py), and the third worker trains while the others wait on servers, launchers and grace periods
# (docs/measured.md: 14 min against 15 min 43 s with two).
TEST_WORKERS ?= 3
# The extras `make drop` removes (pyproject.toml's [tool.template.extras]).
EXTRA ?=

.DEFAULT_GOAL := help
.PHONY: help install lock core-env test-fast train validate evaluate predict plot mlflow-ui lint format test clean drop

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{ name[NR] = $$1; text[NR] = $$2; \
		if (length($$1) > width) width = length($$1) } \
		END { for (i = 1; i <= NR; i++) printf "  make %-" width "s  %s\n", name[i], text[i] }'

# uv installs the lock: uv itself comes from PyPI by pip, pinned with its hashes in uv-bootstrap.txt (`make lock`
# writes that file from uv.lock, whose dev extra holds the same uv, so the sync keeps it).
$(UV): uv-bootstrap.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --no-deps --require-hashes -r uv-bootstrap.txt
	touch $@

# Exactly uv.lock: the core and every extra. Horovod is built into .venv from its sdist (make horovod) and is not in
# the lock, so a sync removes it: it goes back in from its cached wheel.
$(VENV)/installed: $(UV) pyproject.toml uv.lock
	horovod=$$(ls -d $(VENV)/lib/python3*/site-packages/horovod 2>/dev/null); \
	UV_PROJECT_ENVIRONMENT=$(VENV) $(UV) sync --quiet --locked --all-extras --compile-bytecode --no-python-downloads \
		&& if [ -n "$$horovod" ] && [ -f scripts/build_horovod.py ]; then $(PY) -m scripts.build_horovod; fi
	touch $@

install: $(VENV)/installed ## create .venv with exactly uv.lock's packages (the core and every extra of pyproject.toml)

lock: $(UV) ## re-resolve uv.lock (and the serving environment's) and uv-bootstrap.txt after a pin changes
	$(UV) lock
	if [ -f scripts/serving/pyproject.toml ]; then $(UV) lock --project scripts/serving; fi
	{ echo "# The uv that installs uv.lock (make install), pinned with its hashes as uv.lock pins it: make lock writes this."; \
		$(UV) export --quiet --frozen --all-extras --no-emit-project --no-header --no-annotate \
		| awk '/^uv==/ { keep = 1 } keep { print } keep && !/\\$$/ { keep = 0 }'; } > uv-bootstrap.txt

# Exactly uv.lock's core: what `uv sync` installs without an extra. uv hardlinks the packages from its cache, as it
# did for .venv: ~1 min after `make install`, nearly all of it compiling the .pyc files (330 MB, the only new bytes);
# without them every process would compile what it imports (PYTHONDONTWRITEBYTECODE keeps none), ~20 s each.
$(CORE_VENV)/installed: $(UV) pyproject.toml uv.lock
	UV_PROJECT_ENVIRONMENT=$(abspath $(CORE_VENV)) $(UV) sync --quiet --locked --compile-bytecode --no-python-downloads
	touch $@

core-env: $(CORE_VENV)/installed ## create .venv-core: the core dependencies alone, where tests/test_core.py runs every task

train: $(VENV)/installed ## fit configs/TASK.yaml (penguins, mnist, mnist_tutorial, birds, ...), test its best checkpoint
	$(PY) -m scripts.train fit --config $(CONFIG) $(ARGS)

validate: $(VENV)/installed ## validate CKPT on TASK's validation split
	@$(FIND_CKPT); $(PY) -m scripts.train validate --config "$(CONFIG)" --ckpt_path "$$ckpt" $(ARGS)

evaluate: $(VENV)/installed ## test CKPT on TASK's test split (the `test` subcommand)
	@$(FIND_CKPT); $(PY) -m scripts.train test --config "$(CONFIG)" --ckpt_path "$$ckpt" $(ARGS)

predict: $(VENV)/installed ## classify INPUT (a CSV or an image folder) with CKPT
	@test -n "$(INPUT)" || { echo "error: give INPUT=<a folder of images or a file> to classify" >&2; exit 1; }
	@$(FIND_CKPT); \
	$(PY) -m scripts.train predict --config "$(CONFIG)" --ckpt_path "$$ckpt" --data.predict_path "$(INPUT)" $(ARGS)

plot: $(VENV)/installed ## PNG of training and validation loss of RUN (default: the newest run)
	$(PY) -m scripts.plot $(RUN) $(ARGS)

mlflow-ui: $(VENV)/installed ## the MLflow UI over outputs/mlflow.db on http://127.0.0.1:5000 (MLFLOW_PORT=, MLFLOW_STORE=)
	mkdir -p $(dir $(MLFLOW_STORE))
	@# MLflow's server imports a module Starlette deprecates, once per worker: nothing the user can act on.
	@# MLFLOW_JOBS=true starts MLflow's job runner too (seven more processes, for its GenAI jobs; no run here needs it).
	PYTHONWARNINGS='ignore:starlette.middleware.wsgi is deprecated' MLFLOW_SERVER_ENABLE_JOB_EXECUTION=$(MLFLOW_JOBS) \
		$(VENV)/bin/mlflow ui --backend-store-uri sqlite:///$(MLFLOW_STORE) --host 127.0.0.1 --port $(MLFLOW_PORT) \
		--workers $(MLFLOW_WORKERS)

lint: $(VENV)/installed ## ruff
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(VENV)/installed ## ruff format and fix in place
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The project's modules compiled before a test run, which starts over a thousand processes that import them: where
# PYTHONDONTWRITEBYTECODE is set, Python writes no .pyc and each process would compile them again (docs/measured.md).
COMPILE_PROJECT = $(PY) -m compileall -q -j 0 scripts datamodules lightning_modules strategies tests

test: $(VENV)/installed ## lint, then every test (the slow ones too)
	$(MAKE) lint
	@$(COMPILE_PROJECT)
	$(PY) -m pytest -q --durations=15 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)

test-fast: $(VENV)/installed ## lint, then the tests not marked slow: the edit loop
	$(MAKE) lint
	@$(COMPILE_PROJECT)
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)

clean: ## remove outputs/ (runs, checkpoints, the MLflow store)
	rm -rf outputs mlruns

drop: ## remove EXTRA (azure, serving, sweeps, spark, horovod, bench; several: EXTRA="a b") from this checkout
	@test -n "$(EXTRA)" || { echo "error: give EXTRA=<the extra to drop>: azure, serving, sweeps, spark, horovod or bench" >&2; exit 1; }
	python3 -m scripts.drop $(EXTRA)
	$(MAKE) --no-print-directory lock

# extra: sweeps
.PHONY: sweep
sweep: $(VENV)/installed ## Optuna sweep of configs/sweeps/TASK.yaml: trials, best values, a config to train (ARGS="--n_jobs 2")
	$(PY) -m scripts.sweep configs/sweeps/$(TASK).yaml $(ARGS)
# end extra: sweeps

# extra: serving
.PHONY: export serve-env serve
# Serving: Azure ML's inference server runs in its own environment (scripts/serving/environment.yml says why).
SERVE_VENV ?= .venv-serve
MODEL ?= $(CKPT)

export: $(VENV)/installed ## write CKPT as ONNX and check it against PyTorch
	@$(FIND_CKPT); $(PY) -m scripts.export "$$ckpt" $(ARGS)

# Exactly scripts/serving/uv.lock: the lock of scripts/serving/pyproject.toml, environment.yml's pip list beside it.
$(SERVE_VENV)/installed: $(UV) scripts/serving/pyproject.toml scripts/serving/uv.lock
	UV_PROJECT_ENVIRONMENT=$(abspath $(SERVE_VENV)) $(UV) sync --quiet --locked --compile-bytecode \
		--no-python-downloads --project scripts/serving
	touch $@

serve-env: $(SERVE_VENV)/installed ## create .venv-serve: the inference server, MLflow pyfunc, ONNX Runtime; no torch (~20 s, 379 MB)

serve: $(VENV)/installed $(SERVE_VENV)/installed ## serve MODEL (models:/NAME/VERSION, a .ckpt; default CKPT) on 127.0.0.1:5001
	@$(if $(MODEL),ckpt="$(MODEL)",$(FIND_CKPT)); $(PY) -m scripts.serve "$$ckpt" $(ARGS)
# end extra: serving

# extra: azure
.PHONY: submit assets
COMPUTE ?=
# Azure ML assets: DATA (a file or folder) registered as TASK's data asset, VERSION a number.
DATA ?=
VERSION ?=

submit: $(VENV)/installed ## run configs/TASK.yaml as an Azure ML job on COMPUTE (ARGS="--nodes 2 --dry_run true")
	@test -n "$(COMPUTE)" || { echo "error: give COMPUTE=<your Azure ML compute cluster>" >&2; exit 1; }
	$(PY) -m scripts.submit $(CONFIG) --compute $(COMPUTE) $(ARGS)

assets: $(VENV)/installed ## DATA=path as TASK's Azure ML data asset (a CSV also an MLTable), or the environments; VERSION=N
	@test -n "$(VERSION)" || { echo "error: give VERSION=<a number: the assets' next version>" >&2; exit 1; }
	@if [ -n "$(DATA)" ]; then \
		$(PY) -m scripts.assets data $(TASK) "$(DATA)" --version $(VERSION) $(if $(filter %.csv %.tsv,$(DATA)),--mltable true) $(ARGS); \
	else for kind in training training-gpu serving; do \
		$(PY) -m scripts.assets environment $$kind --version $(VERSION) $(ARGS) || exit 1; done; fi
# end extra: azure

# extra: azure, serving
.PHONY: pipeline components deploy
ENDPOINT ?=

pipeline: $(VENV)/installed ## TASK as an Azure ML pipeline, train -> evaluate -> register -> score, on COMPUTE (none: here); INPUT is scored
	$(PY) -m scripts.pipeline $(CONFIG) $(if $(COMPUTE),--compute $(COMPUTE),--local true) $(if $(INPUT),--score_data "$(INPUT)") $(ARGS)

components: $(VENV)/installed ## register TASK's four Azure ML components (train, evaluate, register, score) as VERSION=N
	@test -n "$(VERSION)" || { echo "error: give VERSION=<a number: the components' next version>" >&2; exit 1; }
	$(PY) -m scripts.pipeline $(CONFIG) --components true --version $(VERSION) $(ARGS)

deploy: $(VENV)/installed ## MODEL=NAME:VERSION (the workspace's registry) to ENDPOINT, an Azure ML online endpoint (ARGS="--dry_run true")
	@test -n "$(ENDPOINT)" || { echo "error: give ENDPOINT=<a name for the online endpoint>" >&2; exit 1; }
	$(PY) -m scripts.deploy online $(MODEL) --endpoint $(ENDPOINT) $(ARGS)
# end extra: azure, serving

# extra: spark
.PHONY: spark
PROCESSES ?= 2
# The Spark master for `make spark` (default: the session's, or local[PROCESSES]); e.g. local-cluster[2,1,1024].
MASTER ?=

spark: $(VENV)/installed ## fit configs/TASK.yaml in PROCESSES Spark tasks (TorchDistributor; MASTER=...; needs Java 17)
	$(PY) -m scripts.spark fit --config $(CONFIG) --num_processes $(PROCESSES) $(if $(MASTER),--master "$(MASTER)") $(ARGS)
# end extra: spark

# extra: horovod
.PHONY: horovod horovod-gpu
horovod: $(VENV)/installed ## build Horovod 0.28.1 for CPUs into .venv (~4 min once; needs cmake, g++, libopenmpi-dev)
	$(PY) -m scripts.build_horovod

horovod-gpu: $(VENV)/installed ## build Horovod 0.28.1 with CUDA and NCCL into .horovod-gpu/ (PYTHONPATH=.horovod-gpu; no GPU needed)
	$(PY) -m scripts.build_horovod --gpu --target .horovod-gpu
# end extra: horovod

# extra: bench
.PHONY: bench bench-gpu
bench: $(VENV)/installed ## time the template against plain PyTorch loops, a penguin sweep against one fit (MNIST_DIR=...)
	$(PY) -m scripts.bench.make_train
	$(PY) -m scripts.bench.penguins
	$(PY) -m scripts.bench.mnist --data-dir $(MNIST_DIR) --repeats 3
	$(PY) -m scripts.bench.loop_cost --data-dir $(MNIST_DIR)
	$(PY) -m scripts.bench.birds
	$(PY) -m scripts.bench.table
	$(PY) -m scripts.bench.sweep  # extra: sweeps

bench-gpu: $(VENV)/installed ## on a machine with an NVIDIA GPU: birds and MNIST on it, a real fit, DDP and Horovod with NCCL (logs: outputs/bench-gpu/)
	PY=$(PY) MNIST_DIR=$(MNIST_DIR) bash scripts/bench/gpu.sh
# end extra: bench

# extra: bench, spark
.PHONY: bench-spark
bench-spark: $(VENV)/installed ## time the penguin fit on Spark against torchrun, 2 processes each (needs Java 17)
	$(PY) -m scripts.bench.spark
# end extra: bench, spark

# extra: bench, serving
.PHONY: bench-serve
bench-serve: $(VENV)/installed $(SERVE_VENV)/installed ## the registered model: azmlinfsrv, mlflow models serve, in-process, Spark spark_udf against scripts.score
	$(PY) -m scripts.bench.serve $(ARGS)
# end extra: bench, serving
