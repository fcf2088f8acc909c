"""tools/parity.py's four commands (eval, train, grads, kernels): see its
docstring for what each runs, compares and writes."""
from __future__ import annotations

import argparse
import copy
import math
import os.path as osp

import torch
from mmengine.logging import print_log
from mmengine.runner import set_random_seed

from common import build_runner, config_namespace, load_config
from train import check_precision

# isort: split
# After common, which puts the checkout's bench/ on sys.path.
from bench.step.plot import plot_loss_curves
from msda_mm.compat.mmcv_cuda_build import BuildError
from msda_mm.parity import compare, gradients, kernel_check, training
from msda_mm.parity.attention import OPS, describe, mmcv_side, recorded_outputs, use_op
from msda_mm.parity.report import model_device, write_json


def _mmcv_side(args: argparse.Namespace, device: torch.device):
    try:
        return mmcv_side(args.mmcv, device)
    except (ValueError, BuildError) as e:
        raise SystemExit(f"--mmcv {args.mmcv}: {e}") from None


def _load(args: argparse.Namespace):
    cfg = load_config(config_namespace(args))
    check_precision(cfg, args.config)
    return cfg


def _score_tested_images_only(runner) -> None:
    """With --max-batches the test set keeps its first images (``indices``,
    set in the config); COCO metrics would still score every image of their
    annotation file, counting the others as missed, unless told which."""
    dataset = runner.test_dataloader.dataset
    img_ids = [dataset.get_data_info(i)["img_id"] for i in range(len(dataset))]
    for metric in runner.test_loop.evaluator.metrics:
        if not hasattr(metric, "img_ids"):
            raise SystemExit(f"--max-batches needs COCO metrics, which score a subset of "
                             f"images; the config evaluates with {type(metric).__name__}")
        metric.img_ids = img_ids


def _first_batch_outputs(runner, mmcv) -> dict:
    """Each op's attention-layer outputs on the first test batch."""
    model = runner.model.eval()
    batch = next(iter(runner.test_dataloader))
    outputs = {}
    for op in OPS:
        with use_op(model, op, mmcv), recorded_outputs(model) as outputs[op], torch.no_grad():
            model.test_step(batch)
    return outputs


def _print_eval(report: dict) -> None:
    print(f"\nParity eval of {report['config']} ({report['checkpoint']})")
    for op, impl in report["ops"].items():
        print(f"  {op}: {impl}")
    print(f"\n{'metric':<24}{'triton':>10}{'mmcv':>10}{'diff (AP points)':>19}")
    for row in report["metrics"]:
        print(f"{row['metric']:<24}{row['triton']:>10.3f}{row['mmcv']:>10.3f}"
              f"{row['delta_ap']:>19.2f}")
    print(f"\nAttention outputs on the first test batch:\n"
          f"{'layer':<48}{'max |diff|':>12}{'max |out|':>12}")
    for row in report["layers"]:
        print(f"{row['layer']:<48}{row['max_abs_diff']:>12.3e}{row['max_abs_mmcv']:>12.3e}")
    print(f"\n{'PASS' if report['passed'] else 'FAIL'}: {report['verdict']}")


def _verdict(metrics: list[dict], layers: list[dict],
             args: argparse.Namespace) -> tuple[bool, str]:
    failed = [m["metric"] for m in metrics if not compare.within(m["delta_ap"], args.tolerance_ap)]
    reasons = [f"AP tolerance {args.tolerance_ap} AP points: "
               + (f"exceeded by {', '.join(failed)}" if failed else
                  f"all {len(metrics)} metrics within")]
    if args.tolerance_layer is not None:
        over = [r["layer"] for r in layers if not r["max_abs_diff"] <= args.tolerance_layer]
        failed += over
        reasons.append(f"layer tolerance {args.tolerance_layer:g}: "
                       + (f"exceeded by {', '.join(over)}" if over else
                          f"all {len(layers)} layers within"))
    if not metrics:
        failed.append("no metric")
        reasons.append("the evaluator reported no numeric metric to compare")
    return not failed, "; ".join(reasons)


def evaluate(args: argparse.Namespace) -> int:
    if not osp.isfile(args.checkpoint):
        raise SystemExit(f"checkpoint not found: {args.checkpoint}")
    cfg = _load(args)
    cfg.load_from = args.checkpoint
    if args.max_batches is not None:
        cfg.test_dataloader.dataset.indices = args.max_batches * cfg.test_dataloader.batch_size
    runner = build_runner(cfg)
    if args.max_batches is not None:
        _score_tested_images_only(runner)
    device = model_device(runner.model)
    mmcv = _mmcv_side(args, device)
    ops = {op: describe(op, device, mmcv) for op in OPS}
    results = {}
    for op in OPS:
        print_log(f"Testing with {op}: {ops[op]}", logger="current")
        with use_op(runner.model, op, mmcv):
            results[op] = runner.test()
    outputs = _first_batch_outputs(runner, mmcv)
    metrics = compare.metric_deltas(results["triton"], results["mmcv"])
    layers = compare.layer_diffs(outputs["triton"], outputs["mmcv"])
    passed, verdict = _verdict(metrics, layers, args)
    report = dict(config=args.config, cfg_options=args.cfg_options, checkpoint=args.checkpoint,
                  max_batches=args.max_batches, ops=ops, tolerance_ap=args.tolerance_ap,
                  tolerance_layer=args.tolerance_layer, metrics=metrics, layers=layers,
                  passed=passed, verdict=verdict)
    write_json(args.out / "parity_eval.json", report, device)
    _print_eval(report)
    return 0 if passed else 1


def train(args: argparse.Namespace) -> int:
    cfg = _load(args)
    # Only the seed: deterministic=True (torch.use_deterministic_algorithms)
    # would switch msda_mm to its fixed-point backward but leave mmcv's op on
    # float atomics, comparing two ways of summing grad_value.
    cfg.randomness = dict(seed=args.seed)
    runner = build_runner(cfg)
    training.init_weights(runner, cfg)
    model = runner.model
    device = model_device(model)
    mmcv = _mmcv_side(args, device)
    ops = {op: describe(op, device, mmcv) for op in OPS}
    initial = copy.deepcopy(model.state_dict())
    steps = {}
    for op in OPS:
        model.load_state_dict(initial)
        optim_wrapper, batches = training.start(runner, cfg, args.seed)
        steps[op] = []
        with use_op(model, op, mmcv):
            for i in range(args.iters):
                steps[op].append(training.losses(model.train_step(next(batches), optim_wrapper)))
                print_log(f"{op} iter {i + 1}/{args.iters}: loss {steps[op][-1]['loss']:.6g}",
                          logger="current")
    losses = {op: [s["loss"] for s in steps[op]] for op in OPS}
    rel_diff = compare.relative_differences(losses["triton"], losses["mmcv"])
    # A NaN (a diverged side) counts as the worst difference.
    worst = max(range(args.iters),
                key=lambda i: math.inf if math.isnan(rel_diff[i]) else rel_diff[i])
    report = dict(config=args.config, cfg_options=args.cfg_options, seed=args.seed,
                  iters=args.iters, ops=ops, loss=losses,
                  rel_diff=rel_diff, max_rel_diff=rel_diff[worst], max_rel_diff_iter=worst + 1,
                  log_vars={op: {k: [s[k] for s in steps[op]] for k in steps[op][0]}
                            for op in OPS})
    write_json(args.out / "parity_train.json", report, device)
    iters = range(1, args.iters + 1)
    plot_loss_curves({op: (iters, losses[op]) for op in OPS}, {"triton": (iters, rel_diff)},
                     "mmcv", args.out / "parity_train.png",
                     f"{osp.basename(args.config)}: triton vs mmcv, seed {args.seed}")
    print(f"\nParity train of {args.config}, {args.iters} iterations, seed {args.seed}")
    for op in OPS:
        print(f"  {op} ({ops[op]}): loss {losses[op][0]:.6g} -> {losses[op][-1]:.6g}")
    print(f"max relative difference of the total loss: {rel_diff[worst]:.3e} "
          f"(iteration {worst + 1})\nWritten: {args.out / 'parity_train.json'}, "
          f"{args.out / 'parity_train.png'}")
    return 0


def _one_batch(args: argparse.Namespace):
    """(cfg, model, loss function) for one training batch of the config
    from --checkpoint (or its initialisation) and --seed: the loss of
    train_step's forward under the config's optim_context, without the update."""
    cfg = _load(args)
    cfg.randomness = dict(seed=args.seed)
    if args.checkpoint is not None:
        if not osp.isfile(args.checkpoint):
            raise SystemExit(f"checkpoint not found: {args.checkpoint}")
        cfg.load_from = args.checkpoint
    runner = build_runner(cfg)
    training.init_weights(runner, cfg)
    optim_wrapper, batches = training.start(runner, cfg, args.seed)
    batch, model = next(batches), runner.model

    def loss():
        with optim_wrapper.optim_context(model):
            losses = model._run_forward(model.data_preprocessor(batch, True), mode="loss")
        return model.parse_losses(losses)[0]

    return cfg, model, loss


def grads(args: argparse.Namespace) -> int:
    cfg, model, loss = _one_batch(args)
    report = gradients.compare(model, loss, lambda: set_random_seed(args.seed))
    device = model_device(model)
    write_json(args.out / "parity_grads.json",
               dict(config=args.config, cfg_options=args.cfg_options, seed=args.seed,
                    checkpoint=cfg.get("load_from"), op=describe("triton", device),
                    **report), device)
    print(f"\nGradients of one batch of {args.config}, seed {args.seed}, from "
          f"{cfg.get('load_from') or 'the initial weights'}:")
    print("  loss: " + ", ".join(f"{k} {v:.6g}" for k, v in report["losses"].items()))
    print("  relative difference of each parameter's gradient, median / max:")
    for key, (a, b) in gradients.COMPARISONS.items():
        row = report["summary"][key]
        print(f"    {key:<14}{a + ' vs ' + b:<36}{row['median']:>11.3e} / {row['max']:.3e}")
    keys = gradients.COMPARISONS
    print(f"\n{'most moved by fp32_compute':<60}" + "".join(f"{k:>14}" for k in keys))
    for row in report["parameters"][:10]:
        print(f"{row['parameter']:<60}" + "".join(f"{row[k]:>14.3e}" for k in keys))
    print(f"Written: {args.out / 'parity_grads.json'}")
    return 0


def kernels(args: argparse.Namespace) -> int:
    cfg, model, loss = _one_batch(args)
    device = model_device(model)
    mmcv = _mmcv_side(args, device)
    # The forward alone: each checked call runs its own backward passes.
    with kernel_check.checked_calls(args.max_calls, args.seed, mmcv) as calls, torch.no_grad():
        set_random_seed(args.seed)
        loss()
    ops = dict(triton=describe("triton", device), mmcv=describe("mmcv", device, mmcv))
    write_json(args.out / "parity_kernels.json",
               dict(config=args.config, cfg_options=args.cfg_options, seed=args.seed,
                    checkpoint=cfg.get("load_from"), op=ops["triton"], ops=ops,
                    calls=calls), device)
    return _print_kernels(args.config, calls, args.out / "parity_kernels.json", ops)


def _vs_mmcv(call: dict) -> str:
    """The largest of the fp32 kernels' relative differences from mmcv's, or '-'."""
    diffs = call.get("mmcv_fp32")
    return "-" if diffs is None else f"{max(diffs.values()):.1e}"


def _print_kernels(config: str, calls: list[dict], written, ops: dict) -> int:
    """kernel_check's calls as a table; the exit code (0 all within, 3 one
    not, 4 none to check)."""
    print("\n".join(f"  {op}: {impl}" for op, impl in ops.items()))
    if not calls:
        print(f"No op call of {config} had a bf16 value: nothing to check (the bf16 kernels "
              f"run under bf16 AMP, on CUDA).")
        return 4
    print(f"\nThe op's bf16 calls in one batch of {config}, against the fp32 kernels "
          f"(output / grad_value: worst excess in bf16 units, <= 0 within; grad_loc / "
          f"grad_attn: relative difference, < {kernel_check.GRAD_REL_TOL:g}; vs mmcv: the "
          f"fp32 kernels' largest relative difference from mmcv's CUDA kernels, not judged):")
    print(f"{'call':>4}  {'value':<22}{'locations':<28}{'accum':<7}{'output':>8}"
          f"{'grad_value':>11}{'grad_loc':>10}{'grad_attn':>10}{'vs mmcv':>9}  verdict")
    for c in calls:
        gv = "-" if c["grad_value"] is None else f"{c['grad_value']:.2f}"
        print(f"{c['call']:>4}  {str(tuple(c['value'])):<22}{str(tuple(c['locations'])):<28}"
              f"{'fp32' if c['fp32_grad_accum'] else 'native':<7}{c['output']:>8.2f}{gv:>11}"
              f"{c['grad_loc']:>10.1e}{c['grad_attn']:>10.1e}{_vs_mmcv(c):>9}  "
              f"{'ok' if c['passed'] else 'FAIL'}")
    failed = sum(not c["passed"] for c in calls)
    print(f"{'FAIL' if failed else 'PASS'}: {len(calls) - failed} of {len(calls)} checks "
          f"within. Written: {written}")
    return 3 if failed else 0


COMMANDS = {"eval": evaluate, "train": train, "grads": grads, "kernels": kernels}
