#!/usr/bin/env bash
# Every GPU measurement of the admm issue in one command, so that one call on a lent GPU
# machine (30 minutes of device time per session, 10 per command) gets them all:
#
#   bash benchmarks/gpu_suite.sh OUT_DIR          # on the GPU machine, from the repository root
#
# It uses the machine's own python3 and torch with PYTHONPATH=src (nothing to install), and
# writes one log per step plus summary.txt (the lines BENCHMARKS.md needs) to OUT_DIR:
#   - benchmarks/admm_speed.py at N = 55,000 for 10 x 1000 and 20 x 2400 in fp32 against the
#     reference's iteration at its scripts' ridge weights mu = 0.1 and 0.01 and at mu = 0
#     (20 x 2400: each side alone, two at once would not fit in 80 GB),
#     then deepjimu in TF32 and bf16; each prints s/iter, FLOP/s against a measured matmul
#     peak, and peak memory;
#   - digits accuracy of `jimu train` (admm, 1 worker: NCCL needs one GPU per rank) in
#     fp32, TF32 and bf16, which decides whether TF32/bf16 figures count;
#   - `jimu bench` of every strategy with 1 worker on the GPU (report.md and plots).
# A failing step is logged and the suite goes on. Overrides for a smoke run on a CPU:
#   DEVICE=cpu N=2000 SIZES="3x200" DTYPES="bf16" bash benchmarks/gpu_suite.sh /tmp/smoke
set -u
out=${1:?usage: bash benchmarks/gpu_suite.sh OUT_DIR}
device=${DEVICE:-cuda}
n=${N:-55000}
sizes=${SIZES:-10x1000 20x2400}
dtypes=${DTYPES:-tf32 bf16}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

step() {  # step NAME COMMAND...: run, log to OUT_DIR/NAME.log, record the exit code
    local name=$1 rc
    shift
    echo "== $name: $*" | tee "$out/$name.log"
    "$@" >>"$out/$name.log" 2>&1
    rc=$?
    echo "   exit $rc" | tee -a "$out/$name.log"
}

{
    date -u
    git log -1 --format='commit %H' 2>/dev/null
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
    "$py" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)'
} >"$out/machine.txt"
cat "$out/machine.txt"

speed=("$py" benchmarks/admm_speed.py --device "$device" --n "$n")
for size in $sizes; do
    layers=${size%x*} width=${size#*x}
    iters=$((width > 1500 ? 3 : 5))
    shape=(--layers "$layers" --width "$width" --iters "$iters")
    if ((width > 1500)); then
        step "speed-$size-fp32" "${speed[@]}" "${shape[@]}" --only deepjimu
        for mu in 0.1 0; do  # one reference side at a time: two would not fit in 80 GB
            step "speed-$size-fp32-reference-mu$mu" "${speed[@]}" "${shape[@]}" --only reference --ref-mu $mu
        done
    else
        step "speed-$size-fp32" "${speed[@]}" "${shape[@]}"
    fi
    for dtype in $dtypes; do
        step "speed-$size-$dtype" "${speed[@]}" "${shape[@]}" --dtype "$dtype" --only deepjimu
    done
done

for precision in fp32 $dtypes; do
    step "digits-$precision" "$py" -m deepjimu train --device "$device" --workers 1 \
        --precision "$precision" --quiet --runs-dir "$out/runs" --name "digits-$precision"
done

step bench-1gpu "$py" -m deepjimu bench --workers 1 --train-args "--device $device" \
    --bench-dir "$out" --name bench

grep -h -E "^== |exit [1-9]|^(deepjimu|reference) |ratio|TFLOP/s|peak memory|test_acc" \
    "$out"/speed-*.log "$out"/digits-*.log >"$out/summary.txt"
[ -f "$out/bench/report.md" ] && cat "$out/bench/report.md" >>"$out/summary.txt"
echo
cat "$out/summary.txt"
