"""Command-line pieces that tools/benchmark.py and research/gather_ceiling.py share."""
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
