#!/usr/bin/env bash
# Issue 46 on one GPU: --memory-limit on CUDA (the allocator capped: a budget too small is
# refused or ends in one line, one large enough runs and reports its peak), fsdp and tp on
# NCCL (where there are 2 GPUs), then the plan from a probe of this GPU checked for real (gpu_plan.sh's second step,
# predicted against measured peaks and speeds):
#
#   bash benchmarks/gpu_memory.sh OUT_DIR DATA_DIR     # DATA_DIR holds mnist/
set -u
out=${1:?usage: bash benchmarks/gpu_memory.sh OUT_DIR DATA_DIR}
data=${2:?usage: bash benchmarks/gpu_memory.sh OUT_DIR DATA_DIR}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi -L; "$py" -c "import torch; print('torch', torch.__version__)"
train=("$py" -m deepjimu train --dataset mnist --data-dir "$data" --device cuda --quiet
    --runs-dir "$out/runs" --epochs 2)
for limit in 100M 2900M 5G; do
    echo "== local mlp:8192x4 --memory-limit $limit"
    timeout 60 "${train[@]}" --strategy local --model mlp:8192x4 --memory-limit "$limit" \
        --name "limit-$limit" 2>&1 | tail -2
done
# fsdp and tp take 2 workers or more, one GPU each (NCCL refuses two ranks on one device)
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
for s in fsdp tp; do
    if [ "$gpus" -lt 2 ]; then echo "== $s: skipped, it needs 2 GPUs ($gpus here)"; continue; fi
    echo "== $s x2 on NCCL"
    timeout 60 "${train[@]}" --strategy "$s" --workers 2 --model mlp:4096x4 --name "$s" 2>&1 | tail -2
done
grep -h -e '"peak_mem_mb_per_rank"' -e '"predicted_peak_mb' -A2 "$out"/runs/*/summary.json
echo "== the probe's plan, checked"
"$py" -m deepjimu plan --cluster probe --models "${MODELS:-mlp:4096x16}" --dataset mnist \
    --data-dir "$data" --workers 1 --batch-size 512 --device cuda --check \
    --timeout "${RUN_S:-60}" --out "$out/probe" 2>&1 | tee "$out/probe.log"
