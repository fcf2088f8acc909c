"""Command-line pieces that tools/benchmark.py and the research/ tools share."""
from __future__ import annotations

import argparse


def names(choices):
    """argparse type: comma-separated names, each one of ``choices``."""
    def parse(text: str) -> tuple[str, ...]:
        picked = tuple(n for n in text.split(",") if n)
        unknown = [n for n in picked if n not in choices]
        if unknown or not picked:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(choices)}")
        return picked
    return parse


def tiles(fields: str, example: str):
    """argparse type: comma-separated tiles, each as many positive ints
    joined by 'x' as ``fields`` names (e.g. 'BLOCK_SxWARPSxBLOCK_E')."""
    size = len(fields.split("x"))

    def parse(text: str) -> list[tuple[int, ...]]:
        try:
            picked = [tuple(int(n) for n in t.split("x")) for t in text.split(",")]
            if not picked or any(len(t) != size or min(t) < 1 for t in picked):
                raise ValueError
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected {fields}[,...], e.g. {example}") from None
        return picked
    return parse
