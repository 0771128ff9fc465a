#!/usr/bin/env bash
# What only a GPU can show, in one run on a machine with one NVIDIA GPU (docs/measured.md, "On a GPU"):
#   make bench-gpu                 # or: PY=python3 LOGS=/tmp/gpu bash scripts/bench/gpu.sh
# 1. birds: the JPEG pipeline against the same network (resnet50, then efficientnet_lite0) on tensors already
#    on the GPU (bf16, channels-last);
# 2. MNIST with configs/trainer/gpu.yaml's recipe: the template against plain loops, samples/s;
# 3. MNIST trained for real with configs/mnist.yaml + configs/trainer/gpu.yaml: its test accuracy;
# 4. DDP with NCCL: the same fit under torchrun, one process per GPU (ddp.yaml);
# 5. Horovod's NCCL build, where there is one (make horovod-gpu's .horovod-gpu/, or on PYTHONPATH): the same fit
#    under horovodrun (Gloo starts the processes: no mpirun needed), one process per GPU, its collectives named by
#    Horovod's timeline.
# Each step's whole output goes to $LOGS/<step>.log; its last lines are printed. Needs data/mnist (MNIST_DIR).
set -u
PY=${PY:-.venv/bin/python}
LOGS=${LOGS:-outputs/bench-gpu}
MNIST_DIR=${MNIST_DIR:-data/mnist}
GPUS=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
if [ "$GPUS" = 0 ]; then
    echo "error: make bench-gpu needs an NVIDIA GPU, and nvidia-smi finds none here; run it on a GPU machine" >&2
    exit 1
fi
mkdir -p "$LOGS"
failed=0

step() {  # step NAME SECONDS LINES COMMAND...: the command under a time limit, its log's last LINES lines
    local name=$1 limit=$2 lines=$3 started=$SECONDS status
    shift 3
    echo "== $name: $*"
    timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
    status=$?
    echo "   exit status $status after $((SECONDS - started)) s"
    tail -n "$lines" "$LOGS/$name.log"
    [ "$status" = 0 ] || failed=1
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "$(nproc) CPU cores, $GPUS GPU(s)"
"$PY" -c 'import torch, lightning, mlflow; print("torch", torch.__version__, "CUDA", torch.version.cuda,
    "lightning", lightning.__version__, "mlflow", mlflow.__version__)' || exit 1

# 80 batches: a 20-batch window mostly times the workers filling the first batches of the epoch.
for backbone in resnet50 efficientnet_lite0; do
    step "birds-$backbone" 240 10 "$PY" -m scripts.bench.birds --backbone "$backbone" --precision bf16-mixed \
        --channels-last --batch-size 128 --batches 80 --images 5120 --num-workers "$(($(nproc) - 2))" --repeats 2
done
step mnist-bench 240 14 "$PY" -m scripts.bench.mnist --accelerator gpu --data-dir "$MNIST_DIR" --repeats 3
# A fresh MLflow store and outputs for the two fits, so that nothing of an earlier run is read back.
export MLFLOW_TRACKING_URI="sqlite:///$LOGS/mlflow.db"
step mnist-fit 300 6 "$PY" -m scripts.train fit --config configs/mnist.yaml --config configs/trainer/gpu.yaml \
    --data.init_args.data_dir "$MNIST_DIR" --trainer.enable_progress_bar false
step ddp-nccl 240 6 "$PY" -m torch.distributed.run --nproc_per_node "$GPUS" -m scripts.train fit \
    --config configs/mnist.yaml --config configs/trainer/gpu.yaml --config configs/trainer/ddp.yaml \
    --trainer.devices "$GPUS" --trainer.max_epochs 2 --data.init_args.data_dir "$MNIST_DIR" \
    --trainer.enable_progress_bar false
[ -d .horovod-gpu ] && export PYTHONPATH=.horovod-gpu${PYTHONPATH:+:$PYTHONPATH}  # make horovod-gpu's build
if "$PY" -c 'import sys, horovod.torch as hvd; sys.exit(not hvd.nccl_built())' 2>/dev/null; then
    export HOROVOD_TIMELINE="$LOGS/horovod-timeline.json"
    step horovod-nccl 300 6 "$PY" -m horovod.runner.launch --gloo \
        -np "$GPUS" "$PY" -m scripts.train fit --config configs/mnist.yaml --config configs/trainer/gpu.yaml \
        --config configs/trainer/horovod.yaml --trainer.accelerator gpu --trainer.devices "$GPUS" \
        --trainer.max_epochs 2 --data.init_args.data_dir "$MNIST_DIR" --trainer.enable_progress_bar false
    unset HOROVOD_TIMELINE
    echo "   Horovod's ops: $(grep -o '"name": "NCCL_[A-Z]*"' "$LOGS/horovod-timeline.json" | sort | uniq -c | xargs)"
else
    echo "== horovod-nccl: skipped, no Horovod built with NCCL here (make horovod-gpu builds one)"
fi
exit $failed
