#!/usr/bin/env bash
# Issue 46 on one GPU: the plan on paper and from a probe, checked for real
# (benchmarks/gpu_plan.sh: predicted against measured peaks and speeds), then --memory-limit
# on CUDA (the allocator capped: a budget too small ends in one line, one large enough runs
# and reports its peak), and fsdp and tp on NCCL:
#
#   bash benchmarks/gpu_memory.sh OUT_DIR DATA_DIR     # DATA_DIR holds mnist/
set -u
out=${1:?usage: bash benchmarks/gpu_memory.sh OUT_DIR DATA_DIR}
data=${2:?usage: bash benchmarks/gpu_memory.sh OUT_DIR DATA_DIR}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi -L; "$py" -c "import torch; print('torch', torch.__version__)"
MODELS=${MODELS:-mlp:4096x16} REPEATS=${REPEATS:-1} timeout "${PLAN_S:-330}" \
    bash benchmarks/gpu_plan.sh "$out/plan" "$data"
train=("$py" -m deepjimu train --dataset mnist --data-dir "$data" --device cuda --quiet
    --runs-dir "$out/runs" --epochs 2)
for limit in 100M 2900M 5G; do
    echo "== local mlp:8192x4 --memory-limit $limit"
    timeout 60 "${train[@]}" --model mlp:8192x4 --memory-limit "$limit" --name "limit-$limit" 2>&1 | tail -2
done
for s in fsdp tp; do
    echo "== $s x1 on NCCL"
    timeout 60 "${train[@]}" --strategy "$s" --workers 1 --model mlp:4096x4 --name "$s" 2>&1 | tail -2
done
grep -h '"peak_mem_mb_per_rank"' -A2 "$out"/runs/*/summary.json
