#!/usr/bin/env bash
# The end-to-end GPU results (benchmarks/e2e), one part per GPU job of at most
# 600 s (each job is killed then, so every step runs under a deadline and the results are
# packed before it).
#
#   bash benchmarks/run_e2e.sh {train|profile|seeds|ap|amp|ddp} OUT
#
# train:   DINO R50 on synthetic data in bf16 (then tools/parity.py eval of its
#          checkpoint) and its fp32 twin, the same schedule; then, in the time
#          left in each lane, the profiles of the 800 x 1333 steps (bf16 batch
#          8 after the eval; batch 2 both precisions, then fp32 batch 8, after
#          the fp32 run): these share the host with the other lane's training.
# profile: tools/profile_step.py of the COCO configs at 800 x 1333, batch 2 and
#          8, fp32 and bf16; tools/parity.py train in bf16, native grad_value
#          atomics and forced fp32 accumulation (the pre-Hopper path).
# seeds:   the synthetic R50 training of `train` once per variant of
#          E2E_VARIANTS (default "bf16 fp32"; also bf16_fp32accum: bf16 with
#          fp32 grad_value accumulation, the pre-Hopper path; and
#          bf16_fp32compute: bf16 AMP with the op run on an fp32 copy of the
#          value; bf16_noscale: bf16 AMP without the GradScaler; and the
#          bf16_fp32* variants of KEEP_FP32 below: bf16 AMP with submodules
#          kept in fp32) and seed of E2E_SEEDS (default "0 1"), all runs at
#          once (round-robin over the GPUs; on one GPU they share it): AP
#          against seed-to-seed noise.
# ap:      seeds' runs on the batch-16 schedule that trains DINO to AP 80-87
#          (benchmarks/e2e/ap_warmup200, with the configs' LR warmup;
#          E2E_WARMUP=0 for none, benchmarks/e2e/ap_no_warmup): 16 images a step with msda_mm's
#          BatchedMatchingDINOHead and fused AdamW (the host cut: ~0.33 s a
#          step in bf16, 0.41 in fp32), E2E_EPOCHS (default 16) epochs of 63
#          steps, evaluated every 4, LR drop 2 epochs before the end; seed
#          0 unless E2E_SEEDS; each bf16 run then gets `tools/parity.py
#          grads` and `kernels` on its epoch-4 checkpoint (see seed_run).
#          Meant for one run
#          per GPU: on 2 GPUs, two variants (or seeds) a job; E2E_BUDGET_S
#          defaults to 560 here (fp32: ~500 s).
# amp:     the first E2E_AMP_EPOCHS (default 3: 189 steps) epochs of the ap
#          schedule, evaluated once at the end, no checkpoint or checks, for
#          every variant of E2E_VARIANTS (default: bf16, fp32, bf16_noscale
#          and the KEEP_FP32 ones) at once: which part of bf16 AMP makes its
#          loss lag fp32's from the first steps (every bf16 run of ap_no_warmup
#          did, in its first 50; benchmarks/e2e/amp_bisect has no warmup:
#          E2E_WARMUP=0 to compare with it).
# ddp:     (2 GPUs) the multi-GPU op test; the synthetic bf16 training through
#          tools/dist_train.sh on 2 GPUs (2 x 4 images a step), then the same
#          schedule on one GPU (8 images a step) once per GPU, seeds 0 and 1
#          (the seed-to-seed noise to judge the 2-GPU run by); the 2-GPU run's
#          checkpoint tested through tools/dist_test.sh on 2 GPUs and through
#          tools/test.py on one (the same AP if the ranks' results are
#          gathered); tools/compare_runs.py of the three trainings.
# Two lanes of steps, one per GPU (CUDA_VISIBLE_DEVICES, else nvidia-smi);
# with one GPU they run one after the other.  Writes OUT/PART.log (each step's
# exit code, seconds and command, then the headline numbers) and
# OUT/PART.tar.gz (work_dirs/e2e/PART without checkpoints).
#
# Environment: E2E_EPOCHS (train, default 4) epochs of 125 iterations for
# both precisions; E2E_WARMUP (default: the synthetic configs' own 200)
# steps of linear LR warmup for every synthetic training, 0 for none (the
# schedule of benchmarks/e2e/ap_no_warmup); E2E_BUDGET_S (default 530) seconds until the deadline;
# E2E_SMOKE=1 swaps in the tiny CPU config and a few steps, to test this
# script without a GPU.
set -uo pipefail  # no -e: a failed step is recorded and the others still run

PART=${1:-}
OUT=${2:-}
[[ $PART =~ ^(train|profile|seeds|ap|amp|ddp)$ && -n $OUT ]] || { echo "usage: $0 {train|profile|seeds|ap|amp|ddp} OUT" >&2; exit 2; }
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) && cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
BUDGET=${E2E_BUDGET_S:-530}
[[ $PART == ap ]] && BUDGET=${E2E_BUDGET_S:-560}  # its fp32 run takes ~500 s
END=$((SECONDS + BUDGET))  # SECONDS counts on in the lanes' subshells
RES=work_dirs/e2e/$PART
SUMMARY=$OUT/$PART.log

EPOCHS=${E2E_EPOCHS:-4}
[[ $PART == ap || $PART == amp ]] && EPOCHS=${E2E_EPOCHS:-16}
WORKERS=2  # loader workers per seeds run: the runs share the host's cores
if [[ ${E2E_SMOKE:-0} == 1 ]]; then
    TINY=configs/synthetic/dino_tiny_cpu.py
    SYN_BF16=$TINY SYN_FP32=$TINY COCO_BF16=$TINY COCO_FP32=$TINY
    SIZE=(64 96) BATCHES=(1 2) PARITY_ITERS=3 EPOCHS=${E2E_EPOCHS:-2}
    TRAIN_OPTS=(train_dataloader.dataset.indices=8)   # 2 iterations an epoch
    EVAL_OPTS=(--max-batches 4) PROFILE_OPTS=(--iters 2 --warmup 1 --profile-iters 1)
    export TRITON_INTERPRET=0 OMP_NUM_THREADS=1        # CPU: the PyTorch reference, as the tests
else
    SYN_BF16=configs/synthetic/dino_r50_synthetic_bf16.py
    SYN_FP32=configs/synthetic/dino_r50_synthetic_fp32.py
    COCO_BF16=configs/dino_bf16.py COCO_FP32=configs/dino_fp32.py
    SIZE=(800 1333) BATCHES=(2 8) PARITY_ITERS=50
    TRAIN_OPTS=() EVAL_OPTS=() PROFILE_OPTS=()
    [[ $PART == ap ]] && WORKERS=6  # one run per GPU: 16 images a step to decode
fi
[[ $EPOCHS =~ ^[0-9]+$ && $EPOCHS -ge 2 ]] || { echo "$0: E2E_EPOCHS must be >= 2" >&2; exit 2; }
# The synthetic configs' 6-epoch schedule rescaled to EPOCHS (6 gives it back):
# validation halfway and at the end, LR drop before the last epoch; a
# checkpoint every epoch so that a run cut by the deadline still has one;
# the loss logged every 10 iterations, for curves to compare the precisions.
if [[ $PART == ap || $PART == amp ]]; then
    # The ap schedule (see the header); the checkpoints only with the
    # evaluations (each is ~570 MB with AdamW's state), all kept: seed_run
    # reads the first after the training.
    val=$((EPOCHS < 4 ? EPOCHS : 4))
    TRAIN_OPTS+=(train_cfg.max_epochs="$EPOCHS" train_cfg.val_interval=$val
                 param_scheduler.0.end="$EPOCHS"
                 "param_scheduler.0.milestones=[$((EPOCHS > 2 ? EPOCHS - 2 : 1))]"
                 default_hooks.checkpoint.interval=$val default_hooks.checkpoint.max_keep_ckpts=-1
                 default_hooks.logger.interval=10
                 train_dataloader.batch_size=16 model.bbox_head.type=BatchedMatchingDINOHead
                 optim_wrapper.optimizer.fused=True)
    # amp: its first epochs only, and nothing after the training.
    [[ $PART == amp ]] && TRAIN_OPTS+=(train_cfg.max_epochs="${E2E_AMP_EPOCHS:-3}"
                                       train_cfg.val_interval=1000
                                       default_hooks.checkpoint.save_last=False)
else
    TRAIN_OPTS+=(train_cfg.max_epochs="$EPOCHS" train_cfg.val_interval=$(((EPOCHS + 1) / 2))
                 param_scheduler.0.end="$EPOCHS" "param_scheduler.0.milestones=[$((EPOCHS - 1))]"
                 default_hooks.checkpoint.interval=1 default_hooks.logger.interval=10)
fi
# The pre-Hopper bf16 path: every MSDA module of DINO accumulates grad_value in fp32.
FP32_ACCUM=(model.encoder.layer_cfg.self_attn_cfg.fp32_grad_accum=True
            model.decoder.layer_cfg.cross_attn_cfg.fp32_grad_accum=True)
# bf16 AMP with every MSDA op run on an fp32 copy of its value (fp32_compute).
FP32_COMPUTE=(model.encoder.layer_cfg.self_attn_cfg.fp32_compute=True
              model.decoder.layer_cfg.cross_attn_cfg.fp32_compute=True)
# bf16 AMP with these submodules of DINO (and all under them) in fp32
# (SelectiveAmpOptimWrapper), by variant: the detection head's branches
# (the encoder's class scores that pick the queries, the matching's logits,
# the box deltas); its class branches alone, or its box branches alone; the
# head and the encoder output's projection to proposals (everything that
# turns features into boxes and scores); the head, backbone and neck (the
# transformer alone in bf16); the backbone; the encoder; the whole
# transformer; and every submodule (bf16_fp32all: fp32 arithmetic under
# AmpOptimWrapper and its GradScaler, the control that says whether a bf16
# run's failure needs bf16 at all).  Results of all but bf16_fp32cls and
# bf16_fp32reg: benchmarks/e2e/amp_bisect.
declare -A KEEP_FP32=(
    [bf16_fp32head]=bbox_head
    [bf16_fp32cls]=bbox_head.cls_branches
    [bf16_fp32reg]=bbox_head.reg_branches
    [bf16_fp32boxes]=bbox_head,memory_trans_fc,memory_trans_norm
    [bf16_fp32cnnhead]=backbone,neck,bbox_head
    [bf16_fp32backbone]=backbone
    [bf16_fp32encoder]=encoder
    [bf16_fp32transformer]=encoder,decoder,bbox_head,memory_trans_fc,memory_trans_norm
    [bf16_fp32all]=backbone,neck,positional_encoding,encoder,decoder,query_embedding,memory_trans_fc,memory_trans_norm,bbox_head,dn_query_generator)

if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
    IFS=, read -ra GPUS <<< "$CUDA_VISIBLE_DEVICES"
else
    mapfile -t GPUS < <(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null ||
                        python3 -c 'import torch; [print(i) for i in range(torch.cuda.device_count())]')
fi
VARIANTS=${E2E_VARIANTS:-bf16 fp32}
[[ $PART == amp ]] && VARIANTS=${E2E_VARIANTS:-bf16 fp32 bf16_noscale ${!KEEP_FP32[*]}}
SEEDS=${E2E_SEEDS:-0 1}
[[ $PART == ap || $PART == amp ]] && SEEDS=${E2E_SEEDS:-0}  # ap: one run per GPU
for variant in $VARIANTS; do
    [[ $variant =~ ^(bf16|fp32|bf16_fp32accum|bf16_fp32compute|bf16_noscale)$ || -n ${KEEP_FP32[$variant]:-} ]] ||
        { echo "$0: E2E_VARIANTS: unknown variant '$variant' (bf16, fp32, bf16_fp32accum," \
               "bf16_fp32compute, bf16_noscale, ${!KEEP_FP32[*]})" >&2; exit 2; }
    # Two runs of one variant and seed would share a work_dir.
    [[ " ${seen:-} " != *" $variant "* ]] ||
        { echo "$0: E2E_VARIANTS: '$variant' given twice" >&2; exit 2; }
    seen="${seen:-} $variant"
done
if [[ $PART == ddp ]] && ((${#GPUS[@]} < 2)); then
    echo "$0: the ddp part needs 2 GPUs, found ${#GPUS[@]}" >&2
    exit 2
fi
# No leading 0 (bash would read octal), at most 9 digits (bash's integers).
[[ -z ${E2E_WARMUP+set} || $E2E_WARMUP =~ ^(0|[1-9][0-9]{0,8})$ ]] ||
    { echo "$0: E2E_WARMUP must be a number of steps, got '$E2E_WARMUP'" >&2; exit 2; }
rm -rf "$RES" && mkdir -p "$RES/logs" && : > "$SUMMARY"
# E2E_WARMUP=N: both synthetic configs, as derived ones under $RES/configs,
# with their param_scheduler restated: the MultiStepLR (kept first, as the
# synthetic configs write it: TRAIN_OPTS reschedules param_scheduler.0, and
# a test checks the copy), then, for N > 0, a linear LR warmup over the
# first N steps, which mmengine chains with it.  The configs' own 200 steps
# made every run of two seeds learn in both precisions, where without a
# warmup about half the runs stalled (docs/training.md).
if [[ -n ${E2E_WARMUP+set} ]]; then
    mkdir -p "$RES/configs"
    warmup=()
    ((E2E_WARMUP > 0)) && warmup=(
        "    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=$E2E_WARMUP),")
    for var in SYN_BF16 SYN_FP32; do
        derived=$RES/configs/$(basename "${!var}" .py)_warmup${E2E_WARMUP}.py
        printf '%s\n' "_base_ = '$PWD/${!var}'" "param_scheduler = [" \
            "    dict(type='MultiStepLR', begin=0, end=6, by_epoch=True, milestones=[5], gamma=0.1)," \
            "${warmup[@]}" "]" > "$derived"
        printf -v "$var" '%s' "$derived"
    done
fi
{ echo "# $PART, $(date -u +%FT%TZ), GPUs: ${GPUS[*]:-none}, smoke: ${E2E_SMOKE:-0}, epochs: $EPOCHS"
  nvidia-smi -L 2>/dev/null; } >> "$SUMMARY"
read -ra _v <<< "$VARIANTS"; read -ra _s <<< "$SEEDS"
if [[ $PART == ap ]] && ((${#_v[@]} * ${#_s[@]} > (${#GPUS[@]} > 0 ? ${#GPUS[@]} : 1))); then
    echo "warning: $((${#_v[@]} * ${#_s[@]})) ap runs on ${#GPUS[@]} GPU(s): they share them," \
         "and the schedule was timed one run per GPU" | tee -a "$SUMMARY" >&2
fi

# step NAME RESERVE_S CMD...: run CMD, logging to logs/NAME.log, killed at
# the deadline less RESERVE_S (the time the steps after it in its lane need).
step() {
    local name=$1 limit=$((END - SECONDS - $2)) start=$SECONDS rc
    shift 2
    if ((limit < 20)); then
        printf '%-22s skipped (%ss left)  %s\n' "$name" "$limit" "$*" >> "$SUMMARY"
        return 1
    fi
    timeout -k 15 "$limit" "$@" > "$RES/logs/$name.log" 2>&1
    rc=$?
    printf '%-22s rc=%-3s %4ss  %s\n' "$name" "$rc" $((SECONDS - start)) "$*" >> "$SUMMARY"
    return "$rc"
}

# Writes the synthetic data (of configs, or the HxW train sets of
# profile_step.py) once up front, so that the lanes neither race for it nor
# time its drawing.
PREPARE_DATA='
import sys
sys.path.insert(0, "tools")
from mmengine.config import Config
from msda_mm.datasets.synthetic import ensure_generated
from profile_step_measure import synthetic_dataset
for arg in sys.argv[1:]:
    ds = (Config.fromfile(arg).train_dataloader.dataset if arg.endswith(".py")
          else synthetic_dataset(*map(int, arg.split("x"))))
    ensure_generated(ds["data_root"], **ds["synthetic_cfg"])
'

# lanes A B: run the functions A and B on a GPU each, or one after the other.
lanes() {
    if ((${#GPUS[@]} >= 2)); then
        CUDA_VISIBLE_DEVICES=${GPUS[0]} "$1" & CUDA_VISIBLE_DEVICES=${GPUS[1]} "$2" & wait
    else
        "$1"; "$2"
    fi
}

train_bf16() {
    # 150 s kept for the parity eval: two passes over the 100 val images.
    step train_bf16 150 python3 tools/train.py "$SYN_BF16" --work-dir "$RES/syn_bf16" \
        --cfg-options "${TRAIN_OPTS[@]}"
    local ckpt
    ckpt=$(cat "$RES/syn_bf16/last_checkpoint" 2>/dev/null) || { echo "parity_eval: no checkpoint" >> "$SUMMARY"; return; }
    step parity_eval 0 python3 tools/parity.py eval "$SYN_BF16" "$ckpt" --out "$RES/parity_eval" "${EVAL_OPTS[@]}"
    profile_one "$COCO_BF16" bf16 "${BATCHES[-1]}" 0
}
train_fp32() {
    step train_fp32 0 python3 tools/train.py "$SYN_FP32" --work-dir "$RES/syn_fp32" \
        --cfg-options "${TRAIN_OPTS[@]}"
    profile_one "$COCO_BF16" bf16 "${BATCHES[0]}" 0
    profile_one "$COCO_FP32" fp32 "${BATCHES[0]}" 0
    profile_one "$COCO_FP32" fp32 "${BATCHES[-1]}" 0
}

# profile_one CONFIG NAME BATCH RESERVE_S: one profile_step.py run at SIZE.
profile_one() {
    step "profile_b${3}_$2" "$4" python3 tools/profile_step.py "$1" \
        --image-size "${SIZE[@]}" --batch-size "$3" --out "$RES/b${3}_$2" "${PROFILE_OPTS[@]}"
}

# profile_lane CONFIG NAME PARITY [parity.py --cfg-options ...]: the config's
# profiles at both batch sizes, then a parity training run PARITY of the
# synthetic bf16 config.  Each step keeps ~150 s for each one after it.
profile_lane() {
    local config=$1 name=$2 parity=$3 batch reserve=$((150 * ${#BATCHES[@]})) extra=()
    shift 3
    (($#)) && extra=(--cfg-options "$@")
    for batch in "${BATCHES[@]}"; do
        profile_one "$config" "$name" "$batch" "$reserve"
        reserve=$((reserve - 150))
    done
    step "parity_train_$parity" 0 python3 tools/parity.py train "$SYN_BF16" --iters "$PARITY_ITERS" \
        --out "$RES/parity_train_$parity" "${extra[@]}"
}
profile_fp32() { profile_lane "$COCO_FP32" fp32 native; }
profile_bf16() { profile_lane "$COCO_BF16" bf16 fp32accum "${FP32_ACCUM[@]}"; }

# seed_runs: every (variant, seed) training at once, GPUs round-robin.
seed_runs() {
    local i=0 seed variant gpu cfg extra
    for seed in $SEEDS; do
        for variant in $VARIANTS; do
            gpu=${GPUS[i++ % (${#GPUS[@]} > 0 ? ${#GPUS[@]} : 1)]:-}
            cfg=$SYN_BF16 extra=()
            [[ $variant == fp32 ]] && cfg=$SYN_FP32
            [[ $variant == bf16_fp32accum ]] && extra=("${FP32_ACCUM[@]}")
            [[ $variant == bf16_fp32compute ]] && extra=("${FP32_COMPUTE[@]}")
            [[ $variant == bf16_noscale ]] && extra=(optim_wrapper.loss_scale.enabled=False)
            [[ -n ${KEEP_FP32[$variant]:-} ]] && extra=(optim_wrapper.type=SelectiveAmpOptimWrapper
                                                     "optim_wrapper.fp32_modules=[${KEEP_FP32[$variant]}]")
            CUDA_VISIBLE_DEVICES=$gpu seed_run "$variant" "$seed" "$cfg" "${extra[@]}" &
        done
    done
    wait
}

# seed_run VARIANT SEED CONFIG [OPTIONS...]: one training; in the ap part a
# bf16 run then gets two checks on its first checkpoint (step 252, the loss
# plateau where bf16 runs without a warmup lagged), each with the op as the run
# trained it (bf16_fp32compute's: on bf16 values, as configured without its
# option): tools/parity.py grads, one batch's gradients against
# fp32_grad_accum and fp32_compute beside their run-to-run floor (~30 s);
# and tools/parity.py kernels, every MSDA call of one batch on the bf16
# against the fp32 kernels (~30 s).  Both kept back from the training.
seed_run() {
    local variant=$1 seed=$2 cfg=$3 work=$RES/syn_$1_seed$2 checks=0 check
    shift 3
    [[ $PART == ap && $variant != fp32 ]] && checks=1
    step "train_${variant}_seed$seed" $((checks * 90)) python3 tools/train.py "$cfg" \
        --work-dir "$work" --cfg-options "${TRAIN_OPTS[@]}" randomness.seed="$seed" \
        train_dataloader.num_workers=$WORKERS "$@"
    ((checks)) || return 0
    [[ $variant == bf16_fp32compute ]] && set --
    if [[ ! -f $work/epoch_$val.pth ]]; then
        echo "checks_${variant}_seed$seed   skipped (no $work/epoch_$val.pth)" >> "$SUMMARY"
        return 0
    fi
    for check in grads:40 kernels:0; do  # parity.py subcommand:seconds kept for the next
        step "${check%:*}_${variant}_seed$seed" "${check#*:}" python3 tools/parity.py \
            "${check%:*}" "$cfg" --checkpoint "$work/epoch_$val.pth" --seed "$seed" \
            --out "$work/parity_${check%:*}" --cfg-options "${TRAIN_OPTS[@]}" "$@"
    done
}

# ddp_runs: the 2-GPU training, its one-GPU twins and the tests of its
# checkpoint (see the header).
single_seed0() { single_run 0; }
single_seed1() { single_run 1; }
single_run() {
    step "single_seed$1" 110 python3 tools/train.py "$SYN_BF16" --work-dir "$RES/single_seed$1" \
        --cfg-options "${TRAIN_OPTS[@]}" randomness.seed="$1"
}
ddp_runs() {
    local ckpt
    PYTHON=python3 step ddp_train 280 bash tools/dist_train.sh "$SYN_BF16" 2 \
        --work-dir "$RES/ddp_2gpu" --cfg-options "${TRAIN_OPTS[@]}" train_dataloader.batch_size=4
    lanes single_seed0 single_seed1
    ckpt=$(cat "$RES/ddp_2gpu/last_checkpoint" 2>/dev/null) || { echo "tests: no checkpoint" >> "$SUMMARY"; return; }
    PYTHON=python3 step test_2gpu 60 bash tools/dist_test.sh "$SYN_BF16" "$ckpt" 2 --work-dir "$RES/test_2gpu"
    step test_1gpu 20 python3 tools/test.py "$SYN_BF16" "$ckpt" --work-dir "$RES/test_1gpu"
    step compare_runs 0 python3 tools/compare_runs.py single_seed0="$RES/single_seed0" \
        ddp_2gpu="$RES/ddp_2gpu" single_seed1="$RES/single_seed1" --out "$RES/compare" \
        --title "DINO R50 synthetic bf16: 2 GPUs x 4 images vs 1 GPU x 8"
}

if [[ $PART == train ]]; then
    step prepare_data 0 python3 - "${SIZE[0]}x${SIZE[1]}" "$SYN_BF16" <<< "$PREPARE_DATA"
    lanes train_bf16 train_fp32
    headline='bbox_mAP_copypaste|^coco/bbox_mAP |^(PASS|FAIL)|^\| [0-9]'
elif [[ $PART == seeds || $PART == ap || $PART == amp ]]; then
    step prepare_data 0 python3 - "$SYN_BF16" <<< "$PREPARE_DATA"
    seed_runs
    headline='bbox_mAP_copypaste|^  loss: |^    (floor|fp32_compute|bf16_value) |^(PASS|FAIL): |^No op call'
elif [[ $PART == ddp ]]; then
    step prepare_data 0 python3 - "$SYN_BF16" <<< "$PREPARE_DATA"
    step multigpu_test 0 python3 -m pytest -q -rs -m multigpu tests/ops/test_msda_gpu.py
    ddp_runs
    headline='bbox_mAP_copypaste|[0-9]+ (passed|failed|skipped)|vs single_seed0'
else
    step prepare_data 0 python3 - "${SIZE[0]}x${SIZE[1]}" "$SYN_BF16" <<< "$PREPARE_DATA"
    lanes profile_fp32 profile_bf16
    headline='^\| [0-9]|max relative difference'
fi
# The numbers to read first (the rest is in the tarball), and the last
# training log line per run: its time: field is the seconds per iteration.
{ echo "# results"
  grep -H -E "$headline" "$RES"/logs/*.log
  for log in "$RES"/logs/{*train*,single_*}.log; do
      grep -H -o 'Epoch(train).*\]\[[0-9/]*\].* data_time: [0-9.]*' "$log" | tail -n 1
  done
} 2>/dev/null | sed "s|$RES/logs/||" >> "$SUMMARY"
cp "$SUMMARY" "$RES/"
tar -C work_dirs/e2e --exclude='*.pth' -czf "$OUT/$PART.tar.gz" "$PART"
echo "wrote $OUT/$PART.tar.gz ($(du -h "$OUT/$PART.tar.gz" | cut -f1)), $SUMMARY"
cat "$SUMMARY"
