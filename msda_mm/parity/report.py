"""What tools/parity.py and tools/profile_step.py share when they run: the
model's device and their JSON reports (their command line: tools/common.py)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ..bench.report import environment


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def write_json(path: Path, report: dict, device: torch.device) -> None:
    """``report`` plus the environment (device, torch, triton, date), as
    strict JSON: non-finite floats (a diverged loss) become strings."""
    def strict(value):
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        if isinstance(value, dict):
            return {k: strict(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [strict(v) for v in value]
        return value

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(strict(dict(report, environment=environment(device))),
                               indent=1) + "\n")
