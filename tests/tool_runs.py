"""How the end-to-end tests run the user tools: their environment, the CPU
demo config (configs/synthetic/dino_tiny_cpu.py) cut to a few synthetic
images, and hand-written mmengine logs for the tools that read runs."""
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs/synthetic/dino_tiny_cpu.py"
_TINY = """
_base_ = {base!r}
data_root = {data_root!r}
dataset = dict(data_root=data_root, synthetic_cfg=dict(num_train={num_train}, num_val=4))
train_dataloader = dict(dataset=dataset)
val_dataloader = dict(dataset=dataset)
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator
"""


def tool_env() -> dict:
    """TRITON_INTERPRET=0: CPU tensors take the PyTorch reference, as for a
    user on CPU.  PYTHONPATH: this checkout's msda_mm, wherever the installed
    one is.  One thread: on a shared 2-core box OpenMP's barriers made a step
    50x slower."""
    return dict(os.environ, TRITON_INTERPRET="0", OMP_NUM_THREADS="1",
                PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def write_tiny_demo(path: Path, data_root: str, num_train: int, overrides: str = "",
                    base: Path = DEMO) -> Path:
    """The demo config (or another on its data, ``base``) at ``path``:
    ``num_train`` images in batches of 4, validated and tested on 4,
    generated under ``data_root`` on first use."""
    path.write_text(_TINY.format(base=str(base), data_root=data_root, num_train=num_train)
                    + overrides)
    return path


def write_run(work_dir: Path, losses: dict[int, float], evals: dict[int, float],
              timestamp="20261129_120000", time=0.5) -> Path:
    """A work_dir whose scalars.json logs ``losses`` ({iter: loss}, time
    ``time`` s/iter, except 9 s at the first record) and ``evals``
    ({epoch: mAP fraction})."""
    lines = [dict(loss=loss, iter=it, step=it, time=9.0 if i == 0 else time, memory=100 + it)
             for i, (it, loss) in enumerate(sorted(losses.items()))]
    lines += [{"coco/bbox_mAP": ap, "coco/bbox_mAP_50": 2 * ap, "coco/bbox_mAP_l": -1.0,
               "step": epoch} for epoch, ap in evals.items()]
    path = work_dir / timestamp / "vis_data" / "scalars.json"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return work_dir
