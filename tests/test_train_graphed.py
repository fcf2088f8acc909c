"""GraphedDINO through tools/train.py on CPU (where its steps run eagerly):
the Runner trains it, logs its losses, saves a checkpoint, and --resume
carries on from it with the optimizer's state, as for any other model."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tool_runs import ROOT, tool_env, write_tiny_demo

GRAPHED = ROOT / "configs/synthetic/dino_tiny_graphed.py"
# On CPU: fp32 (AMP needs CUDA), nothing compiled (minutes on a CPU), the
# losses read every step for the LoggerHook's interval of 1.
CPU_RUN = """
optim_wrapper = dict(
    _delete_=True, type='OptimWrapper', constructor='MergedGroupsOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=1e-4, weight_decay=1e-4),
    clip_grad=dict(max_norm=0.1, norm_type=2))
model = dict(log_interval=1, bbox_head=dict(compile_losses=False))
custom_hooks = []
train_dataloader = dict(dataset=dataset, pin_memory=False)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1))
train_cfg = dict(val_interval=10)
"""


def _train(config: Path, work_dir: Path, *args: str) -> str:
    result = subprocess.run([sys.executable, str(ROOT / "tools/train.py"), str(config),
                             "--work-dir", str(work_dir), *args], cwd=ROOT, env=tool_env(),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


@pytest.mark.slow
def test_graphed_dino_trains_saves_and_resumes(tmp_path):
    config = write_tiny_demo(tmp_path / "graphed_run.py", f"{tmp_path}/data/", 8, CPU_RUN,
                             base=GRAPHED)
    work_dir = tmp_path / "work"
    first = _train(config, work_dir, "--cfg-options", "train_cfg.max_epochs=1")
    assert "Epoch(train) [1][2/2]" in first and "loss_cls" in first and "grad_norm" in first
    saved = torch.load(work_dir / "epoch_1.pth", map_location="cpu", weights_only=False)
    assert saved["meta"]["iter"] == 2
    assert saved["optimizer"]["state"]  # AdamW's moments, saved with the weights
    resumed = _train(config, work_dir, "--resume", "--cfg-options", "train_cfg.max_epochs=2")
    assert "resumed epoch: 1, iter: 2" in resumed
    assert "Epoch(train) [2][2/2]" in resumed and "Epoch(train) [1]" not in resumed
    assert (work_dir / "epoch_2.pth").is_file()
