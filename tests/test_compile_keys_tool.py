"""bench/step/compile_keys.py: the graphs torch.compile compiles at each
shape key of a GraphedDINO config, on CPU."""
import argparse
import subprocess
import sys

import pytest
from tool_runs import ROOT, tool_env

from bench.step.compile_keys import main, parse_key


def test_keys_are_four_positive_integers():
    assert parse_key("8,800,1333,10") == (8, 800, 1333, 10)
    for bad in ("8,800,1333", "8,800,1333,0", "8,x,1333,10", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="B,H,W,G"):
            parse_key(bad)


@pytest.mark.slow
def test_a_new_canvas_compiles_once_and_later_ones_not():
    # The demo's layers traced by dynamo alone (backend eager), its losses
    # not compiled: the counts are torch.compile's guards at work.  Several
    # canvases and caps, compiled as the COCO recipe's (torch.compile's
    # default, not the single-canvas configs' static shapes).
    options = ["--backend", "eager", "--cfg-options", "model.bbox_head.compile_losses=False",
               "model.canvas_sizes=[(64,64),(48,64),(80,80)]", "model.gt_caps=[4,8]",
               "custom_hooks.2.dynamic=None"]
    keys = ["2,64,64,3", "2,64,64,3", "2,48,64,3", "2,80,80,7", "2,90,90,3", "3,64,64,3"]
    run = subprocess.run([sys.executable, "-m", "bench.step.compile_keys",
                          str(ROOT / "configs/synthetic/dino_tiny_graphed.py"), *options,
                          "--keys", *keys], cwd=ROOT, env=tool_env(), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line.split(" | ") for line in run.stdout.splitlines() if line.startswith("| ")][2:]
    # (key, graphs compiled): the encoder's and the decoder's layer forward.
    assert [(row[2], int(row[3])) for row in rows] == [
        ("(2, 64, 64, 4)", 2),      # the first shapes: compiled
        ("(2, 64, 64, 4)", 0),      # the same key again
        ("(2, 48, 64, 4)", 2),      # a second canvas: compiled again, sizes dynamic
        ("(2, 80, 80, 8)", 0),      # a third canvas and another cap: nothing
        ("eager (no bucket)", 0),   # outside the buckets, eager: nothing either
        ("(3, 64, 64, 4)", 2),      # a new batch size: compiled again
    ], run.stdout


def test_a_config_without_canvases_is_refused(capsys):
    with pytest.raises(SystemExit) as refused:
        main([str(ROOT / "configs/synthetic/dino_tiny_cpu.py"), "--keys", "2,64,64,3"])
    assert refused.value.code == 2 and "not a GraphedDINO config" in capsys.readouterr().err
