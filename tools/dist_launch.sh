# Sourced by tools/dist_train.sh and tools/dist_test.sh, which set USAGE and
# EXAMPLE and then call `launch`.
#
# Environment (as mmdet's scripts): NNODES (1), NODE_RANK (0), MASTER_ADDR
# (127.0.0.1), PORT (29500); PYTHON (python) is the interpreter that runs
# torchrun.  NCCL settings are left to the cluster's environment.
set -euo pipefail

usage() {
    echo "usage: $0 $USAGE" >&2
    echo "  e.g. $0 $EXAMPLE" >&2
    exit 2
}

# launch TOOL N ARGS...: the first N of ARGS are the command line's
# positional arguments, files (CONFIG, ...) and then GPUS.  Checks them (a
# URL, e.g. a checkpoint mmengine downloads, is left to the tool), then
# starts one process per GPU through torchrun, each running
#   tools/TOOL FILES... REST... --launcher pytorch
launch() {
    local tool=$1 n=$2 file
    shift 2
    (($# >= n)) || usage
    local gpus=${!n}
    for file in "${@:1:n-1}"; do
        [[ -f $file || $file =~ ^[a-zA-Z][a-zA-Z0-9+.-]*:// ]] ||
            { echo "$0: no such file: $file" >&2; usage; }
    done
    [[ $gpus =~ ^[1-9][0-9]*$ ]] || { echo "$0: GPUS must be a positive integer, got '$gpus'" >&2; usage; }
    exec "${PYTHON:-python}" -m torch.distributed.run \
        --nnodes="${NNODES:-1}" \
        --node_rank="${NODE_RANK:-0}" \
        --master_addr="${MASTER_ADDR:-127.0.0.1}" \
        --master_port="${PORT:-29500}" \
        --nproc_per_node="$gpus" \
        "$(dirname "$0")/$tool" "${@:1:n-1}" "${@:n+1}" --launcher pytorch
}
