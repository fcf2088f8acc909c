"""What tools/profile_step.py measures and reports (see its docstring)."""
from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from common import build_runner, config_namespace, load_config, uses_amp
from train import check_precision

# isort: split
# After common, which puts the checkout's bench/ on sys.path.
from bench.step.profiling import STEP, TOP_SYNC_SOURCES, summarise
from bench.step.syncs import counted_syncs
from msda_mm.datasets.synthetic import ann_file
from msda_mm.engine import CompileSubmodulesHook
from msda_mm.parity import training
from msda_mm.parity.attention import as_configured, msda_modules
from msda_mm.parity.report import model_device, write_json

# Synthetic images per --image-size: enough for distinct batches of 8; the
# loader cycles through them (their content does not change a step's cost).
SYNTHETIC_IMAGES = 32


def synthetic_dataset(height: int, width: int) -> dict:
    """A train set of SYNTHETIC_IMAGES shapes images of exactly height x width."""
    return dict(type="SyntheticShapesDataset", data_root=f"data/synthetic_{height}x{width}/",
                synthetic_cfg=dict(num_train=SYNTHETIC_IMAGES, num_val=1, size=(height, width),
                                   seed=0),
                ann_file=ann_file("train"), data_prefix=dict(img="train/"),
                pipeline=[dict(type="LoadImageFromFile"),
                          dict(type="LoadAnnotations", with_bbox=True),
                          dict(type="PackDetInputs")])


def apply_args(cfg, args: argparse.Namespace) -> None:
    if args.batch_size is not None:
        cfg.train_dataloader.batch_size = args.batch_size
    if args.image_size is not None:
        cfg.train_dataloader.dataset = synthetic_dataset(*args.image_size)
    if args.amp_wrapper is not None:
        amp = dict(args.amp_wrapper)
        # A config's own AMP wrapper (a SelectiveAmpOptimWrapper's
        # fp32_modules) stays; only its dtype and loss scale change.
        if amp["type"] != "OptimWrapper" and uses_amp(cfg.optim_wrapper):
            del amp["type"]
        cfg.optim_wrapper.update(amp)
    check_precision(cfg, args.config)


def precision(cfg) -> str:
    wrapper = cfg.optim_wrapper
    if uses_amp(wrapper):
        kept = wrapper.get("fp32_modules")
        return f"AMP {wrapper.get('dtype') or 'float16'}" + (
            f", fp32 {', '.join(kept)}" if kept else "")
    return "fp32"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_steps(model, optim_wrapper, batches, iters: int, device: torch.device,
                back_to_back: bool = False) -> list[float]:
    """Wall seconds of each of ``iters`` steps, synchronised before and after;
    ``back_to_back``: the steps run as a training loop runs them, with no
    wait in between (the host prepares a step while the device runs the
    last) on batches loaded before, each given the mean of the whole run's
    wall time."""
    if back_to_back:
        loaded = [next(batches) for _ in range(iters)]
        _sync(device)
        start = time.perf_counter()
        for data in loaded:
            model.train_step(data, optim_wrapper)
        _sync(device)
        return [(time.perf_counter() - start) / iters] * iters
    seconds = []
    for _ in range(iters):
        data = next(batches)
        _sync(device)
        start = time.perf_counter()
        model.train_step(data, optim_wrapper)
        _sync(device)
        seconds.append(time.perf_counter() - start)
    return seconds


def profiled_steps(model, optim_wrapper, batches, iters: int, device: torch.device) -> dict:
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    # with_stack: Python functions (matching, loss loops) are rows of the
    # host table next to the ops they call.
    with profile(activities=activities, with_stack=True) as prof:
        for _ in range(iters):
            data = next(batches)
            with record_function(STEP):
                model.train_step(data, optim_wrapper)
        _sync(device)
    return summarise(prof.events(), iters)


def sync_sources(model, optim_wrapper, batches, iters: int, device: torch.device):
    """([{frame, per_iter}] of the waits on the device in ``iters`` steps,
    most first, waits per step) from the sync debug mode; None off CUDA or
    for 0 steps."""
    if device.type != "cuda" or iters == 0:
        return None
    with counted_syncs(device) as counts:
        for _ in range(iters):
            model.train_step(next(batches), optim_wrapper)
    return [dict(frame=frame, per_iter=n / iters)
            for frame, n in counts.most_common(TOP_SYNC_SOURCES)], sum(counts.values()) / iters


def compile_as_configured(runner) -> list[str]:
    """Runner.train() first runs every hook's before_train; of those, only
    CompileSubmodulesHook changes the model (the others act on the train
    loop, which this tool does not run): run those.  Returns their paths."""
    paths = []
    for hook in runner.hooks:
        if isinstance(hook, CompileSubmodulesHook):
            hook.before_train(runner)
            paths += hook.modules
    return paths


def measure(cfg, args: argparse.Namespace) -> tuple[dict, torch.device]:
    """The report, and the device the model trained on."""
    runner = build_runner(cfg)
    training.init_weights(runner, cfg)
    model = runner.model
    device = model_device(model)
    optim_wrapper, batches = training.start(runner, cfg, seed=runner.seed)
    compiled = compile_as_configured(runner)
    timed_steps(model, optim_wrapper, batches, args.warmup, device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = timed_steps(model, optim_wrapper, batches, args.iters, device, args.back_to_back)
    peak_mib = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    # What the allocator holds, CUDA graphs' memory pools included: a replay
    # allocates nothing, so its activations are not in the allocated peak.
    reserved_mib = (torch.cuda.max_memory_reserved(device) / 2**20 if device.type == "cuda"
                    else None)
    trace = profiled_steps(model, optim_wrapper, batches, args.profile_iters, device)
    counted = sync_sources(model, optim_wrapper, batches, args.sync_iters, device)
    if counted is None:
        trace.update(sync_sources_method="torch.profiler trace", waits_per_iter=None)
    else:
        trace.update(sync_sources_method="sync debug mode", waits_per_iter=counted[1],
                     sync_sources_per_iter=counted[0])
    batch_size = cfg.train_dataloader.batch_size
    return dict(
        config=args.config, batch_size=batch_size,
        image_size=args.image_size or "config's data", precision=precision(cfg),
        msda_modules=dict(Counter(type(m).__name__ for m in msda_modules(model).values())),
        msda_kernels=as_configured(model, device),
        compiled_modules=compiled,
        warmup=args.warmup, iters=args.iters, profile_iters=args.profile_iters,
        sync_iters=args.sync_iters,
        ms_per_iter=1e3 * statistics.mean(seconds),
        ms_per_iter_median=1e3 * statistics.median(seconds),
        images_per_s=batch_size / statistics.mean(seconds), peak_memory_mib=peak_mib,
        peak_reserved_mib=reserved_mib,
        **trace, step_ms=[1e3 * s for s in seconds]), device


def _fmt(value, spec: str, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def _short(name: str, limit: int = 90) -> str:
    # Templated CUDA kernel names run to hundreds of characters.
    return name if len(name) <= limit else name[:limit - 3] + "..."


def markdown(r: dict) -> str:
    size = "x".join(map(str, r["image_size"])) if isinstance(r["image_size"], list) \
        else r["image_size"]
    lines = [
        f"# Training step: {r['config']}",
        "",
        "| batch | images | precision | ms/iter | images/s | device ms/iter | MSDA share "
        "| host CPU ms/iter | peak GPU memory | reserved |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {r['batch_size']} | {size} | {r['precision']} | {r['ms_per_iter']:.1f} "
        f"| {r['images_per_s']:.2f} | {_fmt(r['device_ms_per_iter'], '.1f')} "
        f"| {_fmt(r['msda_share'], '.1%')} | {r['cpu_ms_per_iter']:.1f} "
        f"| {_fmt(r['peak_memory_mib'], '.0f', ' MiB')} "
        f"| {_fmt(r['peak_reserved_mib'], '.0f', ' MiB')} |",
        "",
        "MSDA: " + "; ".join(f"{n} x {name}: {r['msda_kernels'][name]}"
                             for name, n in r["msda_modules"].items()),
        "",
        *([f"Compiled (CompileSubmodulesHook, during the {r['warmup']} warm-up steps): "
           f"{', '.join(r['compiled_modules'])}", ""] if r["compiled_modules"] else []),
        *([f"Top device kernels per step ({r['profile_iters']} profiled steps):", "",
           "| kernel | calls/iter | ms/iter | share of device-busy |",
           "| --- | --- | --- | --- |",
           *(f"| `{_short(k['name'])}` | {k['calls_per_iter']:.1f} | {k['ms_per_iter']:.2f} "
             f"| {k['share_of_busy']:.1%} |" for k in r["device_top"]), ""]
          if r["device_top"] else []),
        f"Top host costs per step (self CPU time, {r['profile_iters']} profiled steps):",
        "",
        "| op / function | calls/iter | self ms/iter | share of host |",
        "| --- | --- | --- | --- |",
        *(f"| `{h['name']}` | {h['calls_per_iter']:.1f} | {h['self_cpu_ms_per_iter']:.2f} "
          f"| {h['share_of_host']:.1%} |" for h in r["host_top"]),
        "",
        "Synchronisation points per step: " + ", ".join(
            f"{name} {count:g}" for name, count in r["sync_points_per_iter"].items()),
        "",
        "Where the host waits for the device (innermost Python frame outside torch; "
        f"{r['sync_sources_method']}"
        + ("" if r["waits_per_iter"] is None else
           f", {r['sync_iters']} steps: {r['waits_per_iter']:g} waits/iter") + "):",
        "",
        "| frame | waits/iter |",
        "| --- | --- |",
        *(f"| `{s['frame']}` | {s['per_iter']:g} |" for s in r["sync_sources_per_iter"]),
    ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> None:
    """Measure, write profile.json and profile.md, print the table."""
    cfg = load_config(config_namespace(args))
    apply_args(cfg, args)
    result, device = measure(cfg, args)
    write_json(args.out / "profile.json", result, device)
    table = markdown(result)
    (args.out / "profile.md").write_text(table)
    print(table + f"\nWritten: {args.out / 'profile.json'}, {args.out / 'profile.md'}")
