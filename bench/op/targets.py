"""Target bounds per cell, checked after a run.

A targets JSON maps glob patterns over ``preset/dist/dtype/impl`` to upper
bounds on any numeric field of a record, e.g.::

    {"encoder/*/bf16/msda_mm": {"fwd_us": 250, "bwd_us": 900},
     "*/*/*/msda_mm": {"max_err": 0.02}}

Every pattern that matches a cell applies; the cell passes when each bound
holds (a missing or NaN number fails).
"""
from __future__ import annotations

import json
from fnmatch import fnmatchcase
from pathlib import Path


def load_targets(spec: str) -> dict[str, dict[str, float]]:
    """Targets from inline JSON (starting with '{') or a JSON file's path."""
    text = spec if spec.lstrip().startswith("{") else Path(spec).read_text()
    targets = json.loads(text)
    if not isinstance(targets, dict) or not all(
            isinstance(bounds, dict) and all(isinstance(b, (int, float)) for b in bounds.values())
            for bounds in targets.values()):
        raise ValueError('targets must be {"preset/dist/dtype/impl glob": {"field": number}}')
    return targets


def cell_key(record: dict) -> str:
    return "/".join((record["preset"], record["dist"], record["dtype"], record["impl"]))


def _show(value) -> str:
    return format(value, ".4g") if isinstance(value, float) else str(value)


def apply_targets(records: list[dict], targets: dict[str, dict[str, float]]) -> None:
    """Set each record's target_ok (True, False, or None where no pattern
    matches or the cell is n/a) and target_note (the bounds missed)."""
    for record in records:
        bounds = [b for pattern, b in targets.items() if fnmatchcase(cell_key(record), pattern)]
        if not bounds or record["status"] == "n/a":
            record.update(target_ok=None, target_note="")
            continue
        misses = [f"{field} {_show(record.get(field))} > {bound}"
                  for b in bounds for field, bound in b.items()
                  if not (isinstance(record.get(field), (int, float)) and record[field] <= bound)]
        record.update(target_ok=not misses, target_note="; ".join(misses))
