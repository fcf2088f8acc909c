"""Run the benchmark matrix: preset x location distribution x value dtype x
implementation, one record (a flat dict) per cell."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import torch

from msda_mm.ops import resolve_fp32_grad_accum
from msda_mm.ops.tiles import tile_override

from .cell import measure, reference_fp64
from .impls import bind, routed, tiled, unavailable
from .inputs import MSDAInputs, make_inputs
from .presets import PRESETS, Preset

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def preset_inputs(presets, dtypes, device: torch.device
                  ) -> Iterator[tuple[str, str, MSDAInputs]]:
    """(preset, dtype, uniform seed-0 inputs on ``device`` with value in that
    dtype) for each of ``presets`` and ``dtypes`` (names): the research
    tools' matrix, each preset drawn once."""
    for name in presets:
        host = make_inputs(PRESETS[name], "uniform", seed=0)
        for dname in dtypes:
            yield name, dname, host.to(device, DTYPES[dname])

# Error messages are cut here: a Triton compile error can run to pages.
_MAX_NOTE = 300


@dataclass
class Config:
    presets: tuple[str, ...]
    distributions: tuple[str, ...]
    dtypes: tuple[str, ...]
    impls: tuple[str, ...]
    device: torch.device
    fp32_grad_accum: Optional[bool] = None  # msda_mm's; None: its automatic choice
    budget_ms: float = 50.0  # time spent repeating each timed call
    seed: int = 0


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:_MAX_NOTE]


def _release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _cell(cfg: Config, preset: Preset, dist: str, dtype_name: str, impl: str,
          inputs: MSDAInputs, reference, reference_note: str) -> dict:
    record = dict(preset=preset.name, dist=dist, dtype=dtype_name, impl=impl, status="ok",
                  note=reference_note, B=preset.batch, Q=preset.num_queries,
                  S=preset.num_values, M=preset.heads, D=preset.head_dim,
                  L=len(preset.levels), K=preset.points, fp32_grad_accum=None)
    impl, tiles = tiled(impl)
    why_not = unavailable(impl, cfg.device, inputs.value.dtype)
    if why_not:
        record.update(status="n/a", note=why_not)
        return record
    try:
        if impl == "msda_mm":  # msda_mm_det sums grad_value in int64 instead
            record["fp32_grad_accum"] = resolve_fp32_grad_accum(inputs.value,
                                                                cfg.fp32_grad_accum)
        fn = bind(impl, inputs, cfg.fp32_grad_accum)
        with tile_override(**tiles), routed(impl):
            measure(record, fn, inputs, reference, preset, cfg.budget_ms)
    except Exception as exc:  # one cell's failure (OOM, compile error) must not end the run
        record.update(status="error", note=_describe(exc))
    return record


def matrix_size(cfg: Config) -> int:
    """The number of cells in ``cfg``'s matrix."""
    return len(cfg.presets) * len(cfg.distributions) * len(cfg.dtypes) * len(cfg.impls)


def run_matrix(cfg: Config, log: Callable[[str], None] = print,
               on_cell: Callable[[list[dict]], None] = lambda records: None) -> list[dict]:
    """Every cell of ``cfg``'s matrix, in order; failures are recorded in the
    cell (status 'error', note) and the run goes on.  ``on_cell(records)``
    follows each cell, with the records so far."""
    records = []
    total = matrix_size(cfg)
    for preset in (PRESETS[name] for name in cfg.presets):
        for dist in cfg.distributions:
            host_inputs = make_inputs(preset, dist, cfg.seed)
            for dtype_name in cfg.dtypes:
                inputs = host_inputs.to(cfg.device, DTYPES[dtype_name])
                try:
                    reference, reference_note = reference_fp64(inputs), ""
                except Exception as exc:  # e.g. OOM in float64: time the cells anyway
                    reference, reference_note = None, "no errors: reference " + _describe(exc)
                for impl in cfg.impls:
                    start = time.perf_counter()
                    record = _cell(cfg, preset, dist, dtype_name, impl, inputs, reference,
                                   reference_note)
                    records.append(record)
                    _release(cfg.device)
                    times = (f" fwd {record['fwd_us']:.1f} us, bwd {record['bwd_us']:.1f} us"
                             if "bwd_us" in record else "")
                    log(f"[{len(records)}/{total}] {preset.name} {dist} {dtype_name} {impl}: "
                        f"{record['status']}{times} ({time.perf_counter() - start:.1f} s)")
                    on_cell(records)
                del inputs, reference
                _release(cfg.device)
    return records
