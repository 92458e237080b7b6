#!/usr/bin/env bash
# A GPU machine's whole check in one go, as docs/results.md records it: the machine, the collectives under NCCL; the
# GPU check on VGG-11 under bf16-mixed (ddp compiled against a bare loop compiled alike, the speed-up over 32-true
# eager, channels_last on and off, one real CIFAR-10 epoch, the step again under CUDA graphs, every method and
# compression, a few under 16-mixed);
# the GPU check on gpt small (tokens/s and MFU compiled, against 32-true eager); nanoGPT's own train.py beside ours
# (scripts/nanogpt_side_by_side.py, when .gpu/nanogpt/ holds it and its data).
#
#   scripts/gpu_check.sh CIFAR10_JPEG_TARBALL_OR_FOLDER [LOG_DIR]
#
# Every stage has its own time limit, so one that hangs cannot starve the next (their sum is 9 minutes; on an H100 or
# H200 with inductor's cache empty the whole check, compiles included, should take about 8); each stage's whole log
# goes to LOG_DIR (default: a temporary folder), its table to the console, and the rows a stage had printed when its
# limit cut it. BACKEND=gloo DRY=1 dry-runs every stage on CPUs with tiny sizes and 6x the limits. Exit status: the
# number of stages that failed; 64 for an argument or a machine that cannot serve, said in one line before any stage.
set -uo pipefail
refuse() { echo "gpu_check.sh: $*" >&2; exit 64; }
data=${1:?"give the CIFAR-10 JPEG folders (train/, test/) or the tarball holding them"}
logs=${2:-$(mktemp -d)}
case $data in /*) ;; *) data=$PWD/$data ;; esac  # both named from where the script was started
case $logs in /*) ;; *) logs=$PWD/$logs ;; esac
cd "$(dirname "$0")/.."
[ -e "$data" ] || refuse "$data does not exist: give the CIFAR-10 JPEG folders (train/, test/) or the tarball holding them"
mkdir -p "$logs" 2>/dev/null || refuse "LOG_DIR $logs cannot be made a folder (a file stands in its way, or it is not writable)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
backend=${BACKEND:-nccl}
if [ "$backend" = nccl ] && ! python -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    refuse "torch finds no CUDA device here: run it on a GPU machine, or dry-run it on CPUs with BACKEND=gloo DRY=1"
fi
if [ -f "$data" ]; then
    tar xzf "$data" -C "$work" 2>"$work/tar.err" || refuse "$data could not be unpacked as a gzipped tarball ($(tail -1 "$work/tar.err"))"
    data=$work
fi
if [ -n "${DRY:-}" ]; then  # the same stages on CPUs: tiny batches and steps, a few methods; CPUs compile slower
    vgg=(--batch-size 16 --steps 2 --timed-steps 3 --methods ddp,zero,localsgd --float16-methods ddp --epoch-steps 3)
    gpt=(--gpt-layers 1 --gpt-heads 2 --gpt-width 32 --context 32 --batch-size 8 --timed-steps 3)
    side=(--dry --iters 40 --skip 10 --limit 400)
    slow=6
else
    vgg=(--steps 4)
    gpt=(--gpt-size small --batch-size 64)
    side=(--limit 62)
    slow=1
fi
failed=0
stage() {  # stage NAME SECONDS COMMAND...: run it, its log to LOG_DIR, its table (from "GPU check on") to the console
    local name=$1 limit=$(($2 * slow)); shift 2
    local began=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$logs/$name.log" 2>&1
    local status=$?
    echo "== $name: exit $status after $((SECONDS - began)) s (limit $limit s)"
    if grep -q '^GPU check on\|^side by side on' "$logs/$name.log"; then
        sed -n '/^GPU check on\|^side by side on/,$p' "$logs/$name.log"
    elif grep -q '^gpu-check: ' "$logs/$name.log"; then grep '^gpu-check: ' "$logs/$name.log"
    else grep -v 'Warning\|return func' "$logs/$name.log" | tail -8; fi
    [ "$status" = 0 ] || failed=$((failed + 1))
    [ "$status" = 0 ] || grep -q '^GPU check on\|^side by side on' "$logs/$name.log" || tail -15 "$logs/$name.log"
}
date -u
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
python -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'NCCL', torch.cuda.nccl.version())"
stage collectives 15 python -m mpi_train collectives --backend "$backend" --size-mb 64 --iters 5
# the targets first, each stage a process of its own: VGG-11's step compiled, its epoch, channels_last; then eagerly
# every method and compression in bf16-mixed, a few in 16-mixed, the overlapped averages and the resumes
stage vgg11 140 python -m mpi_train gpu-check --backend "$backend" --data-dir "$data" --precision bf16-mixed \
    --compile --parts step,epoch,channels_last "${vgg[@]}" --json "$logs/vgg11.json"
if [ -z "${DRY:-}" ]; then  # the same step under CUDA graphs, which take the host's launches out of both loops
    stage vgg11-graphs 70 python -m mpi_train gpu-check --backend "$backend" --precision bf16-mixed --compile \
        --compile-mode reduce-overhead --parts step "${vgg[@]}" --json "$logs/vgg11-graphs.json"
fi
stage vgg11-methods 100 python -m mpi_train gpu-check --backend "$backend" --precision bf16-mixed \
    --parts methods,float16,overlap,resume "${vgg[@]}" --json "$logs/vgg11-methods.json"
stage gpt-small 95 python -m mpi_train gpu-check --backend "$backend" --model gpt "${gpt[@]}" --precision bf16-mixed \
    --compile --parts step --speedup-target 2.5 --json "$logs/gpt-small.json"
if [ -f .gpu/nanogpt/train.py ]; then  # gpt small's graph is compiled by now: ours meets inductor's cache
    stage nanogpt 130 python scripts/nanogpt_side_by_side.py "${side[@]}"
else
    echo "== nanogpt: skipped, no .gpu/nanogpt/train.py (scripts/nanogpt_side_by_side.py says what to put there)"
fi
exit "$failed"
