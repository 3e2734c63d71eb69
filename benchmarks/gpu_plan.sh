#!/usr/bin/env bash
# `jimu plan` checked on one GPU: the plan on paper (examples/clusters/h100-node.toml, the
# datasheet's peaks and no measurement) and the plan from a probe of this GPU, both against
# the same configurations run for real on it (`--check`), for the two models of BENCHMARKS
# section 13's "beyond this machine" tables, one worker (one GPU: NCCL needs one per rank):
#
#   bash benchmarks/gpu_plan.sh OUT_DIR DATA_DIR     # DATA_DIR holds mnist/ (../shared/data)
#
# Uses the machine's own python3 and torch with PYTHONPATH=src. Smoke run on a CPU:
#   DEVICE=cpu MODELS=mlp:64x2 REPEATS=1 PYTHON=.venv/bin/python bash benchmarks/gpu_plan.sh /tmp/p ../shared/data
set -u
out=${1:?usage: bash benchmarks/gpu_plan.sh OUT_DIR DATA_DIR}
data=${2:?usage: bash benchmarks/gpu_plan.sh OUT_DIR DATA_DIR}
device=${DEVICE:-cuda}
models=${MODELS:-mlp:4096x16,cnn:64x8}
repeats=${REPEATS:-2}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
common=(--models "$models" --dataset mnist --data-dir "$data" --workers 1 --batch-size 512
    --device "$device")
# the paper plan, checked by running every configuration for real here, R rounds
"$py" -m deepjimu plan --cluster examples/clusters/h100-node.toml "${common[@]}" \
    --check --repeats "$repeats" --out "$out/paper" 2>&1 | tee "$out/paper.log"
# the probe's plan (this GPU's measured layer times); its rows are compared with the runs above
"$py" -m deepjimu plan --cluster probe "${common[@]}" --out "$out/probe" 2>&1 | tee "$out/probe.log"
