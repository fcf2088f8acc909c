#!/usr/bin/env bash
# Multi-GPU evaluation: one process per GPU through torchrun, each running
# tools/test.py with --launcher pytorch; the metric gathers every rank's
# predictions and scores the whole test set once.
#
#   tools/dist_test.sh CONFIG CHECKPOINT GPUS [tools/test.py arguments ...]
#
# Environment: see tools/dist_launch.sh.
USAGE="CONFIG CHECKPOINT GPUS [tools/test.py arguments ...]"
EXAMPLE="configs/dino_bf16.py work_dirs/dino/epoch_12.pth 8"
source "$(dirname "$0")/dist_launch.sh"
launch test.py 3 "$@"
