"""What the parts of tools/run_e2e.py train and profile: the configs, the
schedules as --cfg-options, and the precision variants of the synthetic
training."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

TINY = "configs/synthetic/dino_tiny_cpu.py"
SYNTHETIC = {"bf16": "configs/synthetic/dino_r50_synthetic_bf16.py",
             "fp32": "configs/synthetic/dino_r50_synthetic_fp32.py"}
COCO = {"bf16": "configs/dino_bf16.py", "fp32": "configs/dino_fp32.py"}

# The pre-Hopper bf16 path: every MSDA module of DINO accumulates grad_value in fp32.
FP32_ACCUM = ("model.encoder.layer_cfg.self_attn_cfg.fp32_grad_accum=True",
              "model.decoder.layer_cfg.cross_attn_cfg.fp32_grad_accum=True")
# bf16 AMP with every MSDA op run on an fp32 copy of its value.
FP32_COMPUTE = ("model.encoder.layer_cfg.self_attn_cfg.fp32_compute=True",
                "model.decoder.layer_cfg.cross_attn_cfg.fp32_compute=True")
# bf16 AMP with these submodules of DINO (and all under them) in fp32
# (SelectiveAmpOptimWrapper): the detection head's branches, its class or
# box branches alone, the head with the encoder output's projection to
# proposals, the head with backbone and neck, the backbone, the encoder, the
# whole transformer; bf16_fp32all keeps every submodule in fp32 under the
# GradScaler: the control that says whether a bf16 run's failure needs bf16.
KEEP_FP32 = {
    "bf16_fp32head": "bbox_head",
    "bf16_fp32cls": "bbox_head.cls_branches",
    "bf16_fp32reg": "bbox_head.reg_branches",
    "bf16_fp32boxes": "bbox_head,memory_trans_fc,memory_trans_norm",
    "bf16_fp32cnnhead": "backbone,neck,bbox_head",
    "bf16_fp32backbone": "backbone",
    "bf16_fp32encoder": "encoder",
    "bf16_fp32transformer": "encoder,decoder,bbox_head,memory_trans_fc,memory_trans_norm",
    "bf16_fp32all": "backbone,neck,positional_encoding,encoder,decoder,query_embedding,"
                    "memory_trans_fc,memory_trans_norm,bbox_head,dn_query_generator",
}
# Each variant's --cfg-options on the synthetic bf16 config (fp32: on its fp32 twin).
VARIANTS = {
    "bf16": (), "fp32": (), "bf16_fp32accum": FP32_ACCUM, "bf16_fp32compute": FP32_COMPUTE,
    "bf16_noscale": ("optim_wrapper.loss_scale.enabled=False",),
    **{variant: ("optim_wrapper.type=SelectiveAmpOptimWrapper",
                 f"optim_wrapper.fp32_modules=[{modules}]")
       for variant, modules in KEEP_FP32.items()},
}
# The synthetic configs' first scheduler, restated first in the derived
# warmup configs: the schedules reschedule param_scheduler.0.
MULTISTEP_LR = dict(type="MultiStepLR", begin=0, end=6, by_epoch=True, milestones=[5],
                    gamma=0.1)


def default_epochs(part: str, smoke: bool) -> int:
    return 2 if smoke else 16 if part in ("ap", "amp") else 4


def default_variants(part: str) -> tuple[str, ...]:
    return ("bf16", "fp32", "bf16_noscale", *KEEP_FP32) if part == "amp" else ("bf16", "fp32")


def default_seeds(part: str) -> tuple[int, ...]:
    return (0,) if part in ("ap", "amp") else (0, 1)  # ap: one run per GPU


def first_evaluation(epochs: int) -> int:
    """The ap schedule's first evaluated (and saved) epoch."""
    return min(epochs, 4)


def schedule_options(part: str, epochs: int, amp_epochs: int) -> tuple[str, ...]:
    """--cfg-options of every synthetic training of the part.

    ap and amp: 16 images a step with the batched matching head and fused
    AdamW, evaluated and saved every 4 epochs (all kept: the checks read the
    first), LR drop 2 epochs before the end; amp cuts it to its first
    ``amp_epochs`` epochs, evaluated once at the end, nothing saved.
    The others: the synthetic configs' 6-epoch schedule rescaled to
    ``epochs``, validated halfway and at the end, LR drop before the last
    epoch, a checkpoint every epoch (a run cut by the deadline still has one).
    All log the loss every 10 iterations, for curves to compare the runs.
    """
    if part not in ("ap", "amp"):
        return (f"train_cfg.max_epochs={epochs}", f"train_cfg.val_interval={(epochs + 1) // 2}",
                f"param_scheduler.0.end={epochs}", f"param_scheduler.0.milestones=[{epochs - 1}]",
                "default_hooks.checkpoint.interval=1", "default_hooks.logger.interval=10")
    val = first_evaluation(epochs)
    options = (f"train_cfg.max_epochs={epochs}", f"train_cfg.val_interval={val}",
               f"param_scheduler.0.end={epochs}",
               f"param_scheduler.0.milestones=[{max(epochs - 2, 1)}]",
               f"default_hooks.checkpoint.interval={val}",
               "default_hooks.checkpoint.max_keep_ckpts=-1", "default_hooks.logger.interval=10",
               "train_dataloader.batch_size=16", "model.bbox_head.type=BatchedMatchingDINOHead",
               "optim_wrapper.optimizer.fused=True")
    if part == "amp":  # after the schedule's max_epochs, so that the cut wins
        options += (f"train_cfg.max_epochs={amp_epochs}", "train_cfg.val_interval=1000",
                    "default_hooks.checkpoint.save_last=False")
    return options


@dataclass(frozen=True)
class Plan:
    """Everything the steps of a part read."""
    part: str
    res: Path  # work_dirs/e2e/PART
    gpus: tuple[str, ...]
    variants: tuple[str, ...]
    seeds: tuple[int, ...]
    epochs: int
    synthetic: dict  # precision -> config
    coco: dict
    size: tuple[int, int]  # the profiles' H x W
    batches: tuple[int, int]
    parity_iters: int
    train_options: tuple[str, ...]
    eval_options: tuple[str, ...]
    profile_options: tuple[str, ...]
    workers: int  # loader workers of each seeds run: the runs share the host's cores


def make_plan(part: str, res: Path, gpus: tuple[str, ...], variants: tuple[str, ...],
              seeds: tuple[int, ...], epochs: int, amp_epochs: int, smoke: bool) -> Plan:
    """The part's plan; ``smoke``: the tiny CPU config and a few steps of each."""
    schedule = schedule_options(part, epochs, amp_epochs)
    common = dict(part=part, res=res, gpus=gpus, variants=variants, seeds=seeds, epochs=epochs)
    if smoke:
        return Plan(**common, synthetic=dict.fromkeys(SYNTHETIC, TINY),
                    coco=dict.fromkeys(COCO, TINY), size=(64, 96), batches=(1, 2),
                    parity_iters=3,
                    # 2 iterations an epoch, validated on 4 images
                    train_options=("train_dataloader.dataset.indices=8",
                                   "val_dataloader.dataset.indices=4", *schedule),
                    eval_options=("--max-batches", "4"),
                    profile_options=("--iters", "2", "--warmup", "1", "--profile-iters", "1"),
                    workers=2)
    return Plan(**common, synthetic=SYNTHETIC, coco=COCO, size=(800, 1333), batches=(2, 8),
                parity_iters=50, train_options=schedule, eval_options=(), profile_options=(),
                # ap: one run per GPU, 16 images a step to decode
                workers=6 if part == "ap" else 2)


def with_warmup(plan: Plan, steps: int) -> Plan:
    """The plan with its synthetic configs derived under RES/configs: their
    MultiStepLR, then for ``steps`` > 0 a linear LR warmup over the first
    ``steps`` steps, which mmengine chains with it."""
    folder = plan.res / "configs"
    folder.mkdir(parents=True, exist_ok=True)
    schedulers = [MULTISTEP_LR]
    if steps:
        schedulers.append(dict(type="LinearLR", start_factor=0.001, by_epoch=False, begin=0,
                               end=steps))
    derived = {}
    for precision, config in plan.synthetic.items():
        path = folder / f"{Path(config).stem}_warmup{steps}.py"
        path.write_text(f"_base_ = {str(Path(config).resolve())!r}\n"
                        f"param_scheduler = {schedulers!r}\n")
        derived[precision] = str(path)
    return replace(plan, synthetic=derived)
