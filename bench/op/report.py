"""Benchmark results: JSON (with the environment of msda_mm.parity.report), CSV
and the console table."""
from __future__ import annotations

import csv
import json
import math
import os
import re
import sys
from collections import Counter
from pathlib import Path

import torch

from msda_mm.parity.report import device_name, environment

from .targets import cell_key


def slug(name: str) -> str:
    """File-name form of a device name: 'NVIDIA H200' -> 'nvidia-h200'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def _jsonable(value):
    # NaN (a broken kernel's error) stays visible yet keeps the file strict JSON.
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def _replace(path: Path, write) -> None:
    """``write(file)`` into a file beside ``path`` that then replaces it: a
    run killed meanwhile leaves the last whole file, never half of one."""
    part = path.with_name(path.name + ".part")
    try:
        with part.open("w", newline="") as f:
            write(f)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    os.replace(part, path)


def write_json(path: Path, meta: dict, records: list[dict]) -> None:
    cells = [{k: _jsonable(v) for k, v in r.items()} for r in records]
    _replace(path, lambda f: f.write(json.dumps(dict(meta, cells=cells), indent=1) + "\n"))


def write_results(out: Path, device: torch.device, kind: str, cells: list[dict]) -> Path:
    """<out>/<device-slug>-<kind>.json: the environment, the command line and
    ``cells``; prints and returns the path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{slug(device_name(device))}-{kind}.json"
    write_json(path, dict(environment=environment(device), command=" ".join(sys.argv)), cells)
    print(f"Written: {path}")
    return path


def write_csv(path: Path, records: list[dict]) -> None:
    fields = list(dict.fromkeys(k for r in records for k in r))

    def write(f):
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(records)
    _replace(path, write)


def _num(spec: str):
    return lambda v: "-" if v is None else format(v, spec)


_TARGET = {True: "ok", False: "FAIL", None: ""}

# (heading, record field, format); peak is the larger of forward and backward.
_COLUMNS = (
    ("preset", "preset", str), ("dist", "dist", str), ("dtype", "dtype", str),
    ("impl", "impl", str), ("fwd us", "fwd_us", _num(".1f")), ("bwd us", "bwd_us", _num(".1f")),
    ("warm fwd", "fwd_warm_us", _num(".1f")), ("warm bwd", "bwd_warm_us", _num(".1f")),
    ("kern fwd", "fwd_kernel_us", _num(".1f")), ("kern bwd", "bwd_kernel_us", _num(".1f")),
    ("eager f+b us", "eager_fwdbwd_us", _num(".1f")), ("host us", "host_fwdbwd_us", _num(".1f")),
    ("host caller", "host_fwdbwd_caller_us", _num(".1f")),
    ("peak MB", "peak_mb", _num(".1f")), ("max err", "max_err", _num(".1e")),
    ("GB/s", "gather_gbps", _num(".0f")), ("target", "target_ok", _TARGET.get),
)


def console_table(records: list[dict]) -> str:
    """The measured and failed cells as a table, then one line per n/a reason
    and per failure."""
    shown = [r for r in records if r["status"] != "n/a"]
    rows = [[heading for heading, _, _ in _COLUMNS]]
    for r in shown:
        peaks = [r[k] for k in ("peak_fwd_mb", "peak_bwd_mb") if r.get(k) is not None]
        cells = dict(r, peak_mb=max(peaks) if peaks else None)
        row = [fmt(cells.get(field)) for _, field, fmt in _COLUMNS]
        if r["status"] == "error":
            row[4] = "ERROR"
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i < 4 else c.rjust(w) for i, (c, w) in
                       enumerate(zip(row, widths))).rstrip() for row in rows]
    not_run = Counter((r["impl"], r["note"]) for r in records if r["status"] == "n/a")
    lines += [f"n/a   {impl} ({n} cells): {note}" for (impl, note), n in not_run.items()]
    lines += [f"{r['status']:5} {cell_key(r)}: {r['note']}"
              for r in records if r["status"] != "n/a" and r["note"]]
    lines += [f"miss  {cell_key(r)}: {r['target_note']}"
              for r in records if r.get("target_ok") is False]
    return "\n".join(lines)
