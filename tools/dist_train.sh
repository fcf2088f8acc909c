#!/usr/bin/env bash
# Multi-GPU training: one process per GPU through torchrun, each running
# tools/train.py with --launcher pytorch (mmengine's DDP).
#
#   tools/dist_train.sh CONFIG GPUS [tools/train.py arguments ...]
#
# Environment: see tools/dist_launch.sh.
USAGE="CONFIG GPUS [tools/train.py arguments ...]"
EXAMPLE="configs/dino_bf16.py 8 --work-dir work_dirs/dino"
source "$(dirname "$0")/dist_launch.sh"
launch train.py 2 "$@"
