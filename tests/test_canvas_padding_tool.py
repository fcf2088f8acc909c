"""bench/step/canvas_padding.py: the pixels a graphed step computes on
against an eager step's and the images', from a config's loader."""
import subprocess
import sys

import pytest
from tool_runs import ROOT, tool_env, write_tiny_demo

from bench.step.canvas_padding import batch_size_of, padding_summary


def test_pixels_of_canvases_batches_and_images():
    canvases, caps = [(64, 64), (64, 128)], [4, 8]
    batches = [([(48, 64), (64, 40)], 3),   # eager 64 x 64: canvas (64, 64), cap 4
               ([(50, 100), (30, 30)], 5),  # eager 64 x 128 (divisor 32): (64, 128), cap 8
               ([(200, 10)], 1)]            # fits no canvas: eager, its own size
    s = padding_summary(batches, canvases, caps, divisor=32)
    assert s["image_pixels"] == 48 * 64 + 64 * 40 + 50 * 100 + 30 * 30 + 200 * 10
    assert s["eager_pixels"] == 2 * 64 * 64 + 2 * 64 * 128 + 224 * 32
    assert s["graphed_pixels"] == 2 * 64 * 64 + 2 * 64 * 128 + 224 * 32
    assert s["keys"] == {(2, 64, 64, 4): 1, (2, 64, 128, 8): 1}
    assert s["outside_buckets"] == 1
    # A canvas larger than the batch costs its whole area.
    s = padding_summary([([(40, 40)], 1)], [(64, 128)], [4])
    assert (s["eager_pixels"], s["graphed_pixels"]) == (1600, 64 * 128)
    assert batch_size_of([(33, 1), (2, 65)], 32) == (64, 96)


@pytest.mark.slow
def test_the_tool_reads_a_graphed_configs_loader(tmp_path):
    config = write_tiny_demo(tmp_path / "graphed.py", f"{tmp_path}/data/", 8,
                             base=ROOT / "configs/synthetic/dino_tiny_graphed.py")
    run = subprocess.run([sys.executable, "-m", "bench.step.canvas_padding", str(config),
                          "--batch-size", "2", "--batches", "3"], cwd=ROOT, env=tool_env(),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "batch 2, 3 batches" in run.stdout
    # The demo's images are all 128 x 128, its one canvas: no padding.
    assert "| 1.00 | 1.00 | 1.00 | 0 |" in run.stdout
    assert "(2, 128, 128, 6): 3" in run.stdout
    refused = subprocess.run([sys.executable, "-m", "bench.step.canvas_padding",
                              str(ROOT / "configs/synthetic/dino_tiny_cpu.py")], cwd=ROOT,
                             env=tool_env(), capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "not a GraphedDINO config" in refused.stderr
