"""research/compile_check.py: the backward's grad_value atomics, compiled for
sm_80 and sm_90 on the CPU (no GPU needed), at the mmdet default D = 32.

What is checked is what the accumulation-mode auto-selection rests on: bf16
atomic adds are a CAS loop on sm_80 (so auto picks the fp32 scratch there),
fp32 adds are native on both archs, and the vectorised bf16 adds of the
current tile layout are native on sm_90 (so auto keeps bf16 there); and
that the deterministic backward's grad_value kernels have no atomic adds
but one native 32-bit increment a sample.
"""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from research import codegen as cc

TOOL = Path(__file__).resolve().parents[1] / "compile_check.py"

# What the tests read, listed as the tool lists them.  The float-atomic and
# deterministic bf16 backwards (2 archs x 3 accumulation modes):
BACKWARD = cc.variants([80, 90], ["bf16"], [32], ("bwd",))
DETERMINISTIC = cc.variants([80, 90], ["bf16", "fp32"], [32, 64], cc.DET_KERNELS)
WIDE = cc.variants([90], ["bf16"], [256], ("bwd",))
PAIRS = cc.variants([80, 90], ["bf16", "fp16", "fp32"], [32], ("fwd_pairs",))
SOFTMAX_FWD = cc.variants([90], ["bf16", "fp32"], [32], ("fwd",), (False, True))
SOFTMAX_BWD = cc.variants([90], ["bf16", "fp32"], [32], ("bwd",), (False, True))
DUMPED = cc.Variant("fwd", 90, "fp32", 32)


def _environ() -> dict:
    """The environment without TRITON_INTERPRET, which conftest.py set for
    this process: interpreted kernels cannot be compiled."""
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


@pytest.fixture(scope="module")
def compiled(made_once):
    """Each variant above compiled once by ``research/compile_check.py
    --variants``, with --json and --dump: ``rows`` by variant, ``dump``
    the folder of their code.  Under pytest-xdist the first process to ask
    runs the tool, and the others read its rows (conftest.py's made_once)."""
    out = made_once("compile_check", _compile_variants)
    rows = json.loads((out / "rows.json").read_text())
    return SimpleNamespace(rows={cc.Variant.of(r): r for r in rows}, dump=out / "dump")


def _compile_variants(out: Path) -> None:
    todo = dict.fromkeys(BACKWARD + DETERMINISTIC + WIDE + PAIRS + SOFTMAX_FWD + SOFTMAX_BWD
                         + [DUMPED])
    (out / "variants.json").write_text(json.dumps([dataclasses.asdict(v) for v in todo]))
    run = subprocess.run([sys.executable, str(TOOL), "--variants", str(out / "variants.json"),
                          "--json", str(out / "rows.json"), "--dump", str(out / "dump")],
                         env=_environ(), capture_output=True, text=True, timeout=1800)
    print(run.stdout)  # the tables, shown with -s or on failure
    assert (out / "rows.json").is_file(), run.stdout + run.stderr
    # Exit status 1 where a variant failed to compile; that fails the tests
    # that read it.
    failed = any(r["error"] for r in json.loads((out / "rows.json").read_text()))
    assert run.returncode == failed, run.stdout + run.stderr


def _rows(compiled, variants) -> list:
    """The rows of these variants, each compiled without error."""
    rows = [compiled.rows[v] for v in variants]
    for row in rows:
        assert row["error"] is None, row
    return rows


@pytest.fixture
def all_rows(compiled):
    """The six bf16 backward variants (2 archs x 3 accumulation modes)."""
    return _rows(compiled, BACKWARD)


@pytest.fixture
def rows(all_rows):
    """The float-atomic variants by (arch, fp32_accum)."""
    return {(r["arch"], r["fp32_accum"]): r for r in all_rows if not r["deterministic"]}


def _fp32_adds_only(row):
    assert not row["cas_loop"], row
    assert row["ptx_atomics"] and all(".add." in op and op.endswith("f32")
                                      for op in row["ptx_atomics"]), row
    assert row["sass_atomics"] and all(".ADD.F32" in op for op in row["sass_atomics"]), row


def test_variants_and_auto_selection(rows):
    assert set(rows) == {(80, True), (80, False), (90, True), (90, False)}
    assert rows[80, True]["auto"] and rows[90, False]["auto"]
    assert not rows[80, False]["auto"] and not rows[90, True]["auto"]


@pytest.mark.parametrize("arch", [80, 90])
def test_fp32_accumulation_is_native(rows, arch):
    _fp32_adds_only(rows[arch, True])


def test_native_bf16_on_sm80_is_a_cas_loop(rows):
    row = rows[80, False]
    assert row["cas_loop"], row
    assert any("CAS" in op for op in row["sass_atomics"]), row


def test_native_bf16_on_sm90_is_a_vector_red(rows):
    # A scalar bf16 add would be a CAS loop here too (see the D = 24 rows of
    # the tool); the D-contiguous tile gives each thread a bf16 vector.
    row = rows[90, False]
    assert not row["cas_loop"], row
    assert row["ptx_atomics"] and all(".add.noftz.v" in op and op.endswith("bf16")
                                      for op in row["ptx_atomics"]), row
    assert row["sass_atomics"] and all(".ADD.BF16x" in op for op in row["sass_atomics"]), row


@pytest.mark.parametrize("arch", [80, 90])
def test_backward_waits_for_the_fill_only_where_pdl_exists(rows, arch):
    # Programmatic dependent launch is sm_90+: there the backward starts
    # during grad_value's fill and waits for it once, before its atomics;
    # an sm_80 build must not contain the instruction at all.
    for fp32_accum in (True, False):
        row = rows[arch, fp32_accum]
        assert row["pdl_waits"] == (1 if arch >= 90 else 0), row


def test_deterministic_backward_adds_no_grad_value(all_rows):
    # msda_bwd_kernel given no grad_value: grad_loc and grad_attn, and the
    # counting sort's ranks, one native 32-bit atomic increment a sample (no
    # CAS loop); no fill to wait for.
    det = {r["arch"]: r for r in all_rows if r["deterministic"]}
    assert set(det) == {80, 90}
    for row in det.values():
        assert row["error"] is None and not row["cas_loop"], row
        assert row["ptx_atomics"] == {"atom.global.gpu.relaxed.add.u32": 1}, row
        assert row["pdl_waits"] == 0, row
        assert row["spill_stores"] == 0 and row["spill_loads"] == 0, row


def test_deterministic_grad_value_kernels_add_in_registers(compiled):
    # The bucketed gather: one native 64-bit atomic max a program on the
    # bound's bits (no CAS loop), none in the fills, in msda_bwd_kernel with
    # the stable sort's keys and records, and in either gather, which sums
    # its terms in registers; no spills at D = 32 and 64.
    kernels = ("bound", "bucket_fill", "gather", "stable_bwd", "sorted_fill", "stable_gather")
    rows = _rows(compiled, DETERMINISTIC)
    assert {(r["kernel"], r["arch"], r["head_dim"]) for r in rows} == {
        (k, a, d) for k in kernels for a in (80, 90) for d in (32, 64)}
    for row in rows:
        assert row["error"] is None and not row["cas_loop"], row
        assert row["spill_stores"] == 0 and row["spill_loads"] == 0, row
        if row["kernel"] == "bound":
            assert row["ptx_atomics"] == {"atom.global.gpu.relaxed.max.s64": 1}, row
        else:
            assert not row["ptx_atomics"] and not row["sass_atomics"], row
        if row["kernel"] == "bucket_fill":  # a record: one 16-byte store
            assert row["sass_stores"] == {"STG.E.128": 1}, row
        if row["kernel"] == "sorted_fill":  # and a bucket's first and last entry
            assert row["sass_stores"] == {"STG.E.128": 1, "STG.E": 2}, row


def test_wide_heads_do_not_spill(compiled):
    # D = 256 (one head of 256): one warp per program held 4 x 16 x 256
    # corner values and spilled (14 registers native, 236 with fp32
    # accumulation); Tiles.tile adds warps instead (the int64 rows too).
    for row in _rows(compiled, WIDE):
        assert row["spill_stores"] == 0 and row["spill_loads"] == 0, row


def test_pairs_forward_reads_16_byte_words_without_spills(compiled):
    # msda_fwd_pairs_kernel (large grids) reads value as int32 (fp16/bf16) or
    # int64 (fp32) words of two channels: at D = 32 each corner row must
    # still be one 16-byte load per thread, on both archs.
    rows = _rows(compiled, PAIRS)
    assert len(rows) == 6
    for row in rows:
        assert row["error"] is None, row
        assert row["sass_loads"].get("LDG.E.128", 0) == 64, row  # 16 points x 4 corners
        assert row["spill_stores"] == 0 and row["spill_loads"] == 0, row


def test_fused_softmax_forward_adds_exps_only(compiled):
    # softmax=True (msda_fwd_kernel, the decoder's call): one exp per sample
    # and a max pass over the logits, the value rows read as before and no
    # spills; the default variants have no exp at all.
    rows = _rows(compiled, SOFTMAX_FWD)
    by_key = {(r["arch"], r["dtype"], r["softmax"]): r for r in rows}
    assert len(by_key) == 4
    for (arch, dtype, softmax), row in by_key.items():
        assert row["error"] is None, row
        assert row["spill_stores"] == 0 and row["spill_loads"] == 0, row
        default = by_key[arch, dtype, False]
        assert row["sass_loads"]["LDG.E.128"] == default["sass_loads"]["LDG.E.128"], row
        assert (row["exps"] > 0) == softmax, row


def test_fused_softmax_backward_keeps_its_atomics(compiled):
    # softmax=True (msda_bwd_kernel, the decoder's call, auto accumulation):
    # exps for the softmax passes, the same grad_value atomics and fill wait
    # as without it, and no spills.
    rows = _rows(compiled, SOFTMAX_BWD)
    by_key = {(r["dtype"], r["softmax"]): r for r in rows if r["auto"] and not r["deterministic"]}
    assert len(by_key) == 4
    for (dtype, softmax), row in by_key.items():
        assert row["error"] is None, row
        assert row["spill_stores"] == 0 and row["spill_loads"] == 0, row
        default = by_key[dtype, False]
        assert row["sass_atomics"] == default["sass_atomics"], row
        assert row["pdl_waits"] == default["pdl_waits"] == 1, row
        assert (row["exps"] > 0) == softmax, row
    assert not any(r["softmax"] and r["deterministic"] for r in rows)


def test_corner_bounds_checks_compare_unsigned():
    # _bilinear_corners keeps wrapped int32 indices (shapes that disagree
    # with value) in bounds only if `i.to(uint32) < S` stays an unsigned
    # comparison after Triton's type promotion with the int32 S: one per
    # corner of each sample chunk (the pairs forward: 16 points x 4 corners).
    script = (
        "from research import codegen as cc\n"
        "for kern in ('fwd', 'fwd_pairs', 'bwd'):\n"
        "    v = cc.variants([90], ['bf16'], [32], (kern,))[0]\n"
        "    k = cc._compile(*cc._recorded_launch(v), 90)\n"
        "    print(kern, k.asm['ttir'].count('arith.cmpi ult'))\n")
    run = subprocess.run([sys.executable, "-c", script], env=_environ(), capture_output=True,
                         text=True, timeout=600, cwd=TOOL.parents[1])
    assert run.returncode == 0, run.stderr
    counts = dict(line.split() for line in run.stdout.splitlines())
    assert counts == {"fwd": "4", "fwd_pairs": "64", "bwd": "4"}, run.stdout


def test_pairs_variants_only_where_the_launcher_takes_the_pairs_kernel():
    rows = cc.variants([90], ["fp32", "bf16", "fp16"], [31, 32], ("fwd_pairs",))
    assert [(v.dtype, v.head_dim) for v in rows] == [("fp32", 32), ("bf16", 32), ("fp16", 32)]


def test_dump_writes_code_without_debug_lines(compiled):
    # --dump: what two checkouts' code is compared by (debug lines and
    # labels move with every source line and are left out).
    _rows(compiled, [DUMPED])
    ptx = (compiled.dump / "fwd-sm90-fp32-d32.ptx").read_text()
    sass = (compiled.dump / "fwd-sm90-fp32-d32.sass").read_text()
    assert ".entry msda_fwd_kernel" in ptx and "ld.global" in ptx
    assert ".loc" not in ptx and "$L__tmp" not in ptx and ".debug" not in ptx
    assert "LDG.E" in sass
