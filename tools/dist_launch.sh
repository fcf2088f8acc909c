# Sourced by tools/dist_train.sh and tools/dist_test.sh: the checks and the
# torchrun command they share.  Each sets USAGE and EXAMPLE first.
#
# Environment (as mmdet's scripts): NNODES (1), NODE_RANK (0), MASTER_ADDR
# (127.0.0.1), PORT (29500); PYTHON (python) is the interpreter that runs
# torchrun.  NCCL settings are left to the cluster's environment.

usage() {
    echo "usage: $0 $USAGE" >&2
    echo "  e.g. $0 $EXAMPLE" >&2
    exit 2
}

# check_config_and_gpus CONFIG GPUS: exits with the usage unless CONFIG is a
# file and GPUS a positive integer.
check_config_and_gpus() {
    [[ -f $1 ]] || { echo "$0: no such config: $1" >&2; usage; }
    [[ $2 =~ ^[1-9][0-9]*$ ]] || { echo "$0: GPUS must be a positive integer, got '$2'" >&2; usage; }
}

# torchrun GPUS TOOL ARGS...: one process per GPU, each running
# tools/TOOL ARGS --launcher pytorch.
torchrun() {
    local gpus=$1 tool=$2
    shift 2
    exec "${PYTHON:-python}" -m torch.distributed.run \
        --nnodes="${NNODES:-1}" \
        --node_rank="${NODE_RANK:-0}" \
        --master_addr="${MASTER_ADDR:-127.0.0.1}" \
        --master_port="${PORT:-29500}" \
        --nproc_per_node="$gpus" \
        "$(dirname "$0")/$tool" "$@" --launcher pytorch
}
