"""The synthetic shapes detection dataset: drawing, writing, command line."""
from .render import CLASSES, PALETTE, render
from .writer import SPLITS, ann_file, ensure_generated, generate

__all__ = ["CLASSES", "PALETTE", "SPLITS", "ann_file", "ensure_generated", "generate", "render"]
