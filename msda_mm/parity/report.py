"""The JSON reports of tools/parity.py and tools/profile_step.py: the model's
device, and the environment a report was made in (device, torch, triton,
date), which tools/benchmark.py records too."""
from __future__ import annotations

import datetime
import json
import math
import platform
from pathlib import Path

import torch
import triton


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def environment(device: torch.device) -> dict:
    """The device (on CUDA with its capability, SMs, memory and L2), the
    torch, triton and Python versions, and the date (UTC)."""
    env = dict(device=device_name(device), torch=torch.__version__, triton=triton.__version__,
               python=platform.python_version(),
               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count,
                   memory_gb=round(props.total_memory / 1e9, 1),
                   l2_mb=getattr(props, "L2_cache_size", 0) / 2**20)
    return env


def write_json(path: Path, report: dict, device: torch.device) -> None:
    """``report`` plus the environment, as strict JSON: non-finite floats (a
    diverged loss) become strings."""
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
