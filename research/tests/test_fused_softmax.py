"""research/fused_softmax.py: both modes timed and compared, the saving
computed, the JSON written (CPU: Triton interpreter, the tiny preset)."""
import json
import runpy
from pathlib import Path

import pytest


def _main(argv):
    return runpy.run_path(str(Path(__file__).resolve().parents[1] / "fused_softmax.py"))[
        "main"](argv)


def _cells(out: Path) -> dict:
    (path,) = out.glob("*-fused-softmax.json")
    return {(c["preset"], c["dtype"], c["mode"]): c for c in json.loads(path.read_text())["cells"]}


def test_tool_times_both_modes_on_cpu(tmp_path, capsys):
    assert _main(["--presets", "tiny", "--dtypes", "fp32", "--device", "cpu",
                  "--budget-ms", "1", "--out", str(tmp_path)]) == 0
    cells = _cells(tmp_path)
    assert set(cells) == {("tiny", "fp32", m) for m in ("unfused", "fused", "saving")}
    unfused, fused, saving = (cells["tiny", "fp32", m] for m in ("unfused", "fused", "saving"))
    assert unfused["fwdbwd_us"] > 0 and fused["fwdbwd_us"] > 0
    assert saving["fwd_us"] == pytest.approx(unfused["fwd_us"] - fused["fwd_us"])
    assert unfused["kept_mb"] is None  # no memory figures on CPU
    # The same function both ways: fp32 rounding (sums of 8 points' samples).
    assert saving["max_rel_diff"] < 1e-5
    assert "fused against unfused: max relative difference" in capsys.readouterr().out


def test_cpu_without_the_interpreter_is_refused(monkeypatch, capsys):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(SystemExit):
        _main(["--device", "cpu"])
    assert "--device cpu needs TRITON_INTERPRET=1" in capsys.readouterr().err


@pytest.mark.gpu
def test_tool_on_cuda_measures_time_and_memory(tmp_path):
    assert _main(["--presets", "decoder", "--dtypes", "bf16", "--budget-ms", "20",
                  "--out", str(tmp_path)]) == 0
    cells = _cells(tmp_path)
    unfused, fused, saving = (cells["decoder", "bf16", m] for m in ("unfused", "fused", "saving"))
    assert all(c[k] > 0 for c in (unfused, fused)
               for k in ("fwd_us", "fwdbwd_us", "peak_fwd_mb", "kept_mb", "peak_bwd_mb"))
    # Unfused, the forward keeps the fp32 weights (B*Q*M*L*K = 153600: 0.59
    # MiB) beside the output; fused, only the output (the logits are inputs).
    assert saving["kept_mb"] == pytest.approx(153600 * 4 / 2**20, rel=0.05)
    # bf16: unfused, the logits' gradient p * (g - sum(p * g)) is rounded to bf16
    # at each step, fused it is taken in fp32 (H200: 1.4e-2 to 1.5e-2 of its largest
    # value apart); a wrong softmax is O(1) apart.
    assert saving["max_rel_diff"] < 2**-5
