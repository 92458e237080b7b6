#!/usr/bin/env bash
# A GPU machine's whole check in one go, as docs/results.md records it: the machine, the collectives under NCCL, the
# GPU check on VGG-11 with one real CIFAR-10 epoch, and the GPU check on gpt small (tokens/s, MFU, memory per rank).
#
#   scripts/gpu_check.sh CIFAR10_JPEG_TARBALL_OR_FOLDER [LOG_DIR]
#
# Every stage has its own time limit, so one that hangs cannot starve the next; each stage's whole log goes to
# LOG_DIR (default: a temporary folder), its table to the console. BACKEND=gloo dry-runs it on CPUs. Exit status: the number of stages that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
data=${1:?"give the CIFAR-10 JPEG folders (train/, test/) or the tarball holding them"}
logs=${2:-$(mktemp -d)}
mkdir -p "$logs"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if [ -f "$data" ]; then
    tar xzf "$data" -C "$work" && data=$work
fi
failed=0
stage() {  # stage NAME SECONDS COMMAND...: run it, its log to LOG_DIR, its table (from "GPU check on") to the console
    local name=$1 limit=$2; shift 2
    local began=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$logs/$name.log" 2>&1
    local status=$?
    echo "== $name: exit $status after $((SECONDS - began)) s"
    if grep -q '^GPU check on' "$logs/$name.log"; then sed -n '/^GPU check on/,$p' "$logs/$name.log"
    else grep -v 'Warning\|return func' "$logs/$name.log" | tail -8; fi
    [ "$status" = 0 ] || failed=$((failed + 1))
    [ "$status" = 0 ] || grep -q '^GPU check on' "$logs/$name.log" || tail -15 "$logs/$name.log"
}
date -u
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
python -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'NCCL', torch.cuda.nccl.version())"
stage collectives 45 python -m mpi_train collectives --backend "${BACKEND:-nccl}" --size-mb 64 --iters 5
stage vgg11 300 python -m mpi_train gpu-check --backend "${BACKEND:-nccl}" --data-dir "$data" --json "$logs/vgg11.json"
stage gpt-small 120 python -m mpi_train gpu-check --backend "${BACKEND:-nccl}" --model gpt --gpt-size small --batch-size 64 \
    --methods ddp,bucketed,zero,fsdp,zero_torch,localsgd --json "$logs/gpt-small.json"
exit "$failed"
