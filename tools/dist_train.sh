#!/usr/bin/env bash
# Multi-GPU training: one process per GPU through torchrun, each running
# tools/train.py with --launcher pytorch.
#
#   tools/dist_train.sh CONFIG GPUS [tools/train.py arguments ...]
#
# Environment (as mmdet's script): NNODES (1), NODE_RANK (0), MASTER_ADDR
# (127.0.0.1), PORT (29500); PYTHON (python) is the interpreter that runs
# torchrun.  NCCL settings are left to the cluster's environment.
set -euo pipefail

usage() {
    echo "usage: $0 CONFIG GPUS [tools/train.py arguments ...]" >&2
    echo "  e.g. $0 configs/dino_bf16.py 8 --work-dir work_dirs/dino" >&2
    exit 2
}

[[ $# -ge 2 ]] || usage
CONFIG=$1
GPUS=$2
[[ -f $CONFIG ]] || { echo "$0: no such config: $CONFIG" >&2; usage; }
[[ $GPUS =~ ^[1-9][0-9]*$ ]] || { echo "$0: GPUS must be a positive integer, got '$GPUS'" >&2; usage; }

TOOLS=$(dirname "$0")
exec "${PYTHON:-python}" -m torch.distributed.run \
    --nnodes="${NNODES:-1}" \
    --node_rank="${NODE_RANK:-0}" \
    --master_addr="${MASTER_ADDR:-127.0.0.1}" \
    --master_port="${PORT:-29500}" \
    --nproc_per_node="$GPUS" \
    "$TOOLS/train.py" "$CONFIG" --launcher pytorch "${@:3}"
