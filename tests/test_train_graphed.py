"""GraphedDINO through tools/train.py on CPU (where its steps run eagerly;
the tool's main in the test's process): the Runner trains it, logs its
losses, saves a checkpoint, and --resume carries on from it with the
optimizer's state, as for any other model."""
import runpy
from pathlib import Path

import pytest
import torch
from tool_runs import ROOT, write_tiny_demo

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


@pytest.fixture
def train(monkeypatch, reference_backend, one_intra_op_thread, capsys):
    """tools/train.py CONFIG --work-dir WORK_DIR ARGS in this process, as on
    a CPU without the interpreter: its output."""
    monkeypatch.syspath_prepend(str(ROOT / "tools"))
    monkeypatch.setenv("LOCAL_RANK", "0")  # what load_config would set
    main = runpy.run_path(str(ROOT / "tools/train.py"))["main"]

    def run(config: Path, work_dir: Path, *args: str) -> str:
        main([str(config), "--work-dir", str(work_dir), *args])
        return capsys.readouterr().out

    return run


@pytest.mark.slow
def test_graphed_dino_trains_saves_and_resumes(tmp_path, train):
    config = write_tiny_demo(tmp_path / "graphed_run.py", f"{tmp_path}/data/", 8, CPU_RUN,
                             base=GRAPHED)
    work_dir = tmp_path / "work"
    first = train(config, work_dir, "--cfg-options", "train_cfg.max_epochs=1")
    assert "Epoch(train) [1][2/2]" in first and "loss_cls" in first and "grad_norm" in first
    saved = torch.load(work_dir / "epoch_1.pth", map_location="cpu", weights_only=False)
    assert saved["meta"]["iter"] == 2
    assert saved["optimizer"]["state"]  # AdamW's moments, saved with the weights
    resumed = train(config, work_dir, "--resume", "--cfg-options", "train_cfg.max_epochs=2")
    assert "resumed epoch: 1, iter: 2" in resumed
    assert "Epoch(train) [2][2/2]" in resumed and "Epoch(train) [1]" not in resumed
    assert (work_dir / "epoch_2.pth").is_file()
