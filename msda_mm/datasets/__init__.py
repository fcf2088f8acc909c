"""Datasets: the self-generating synthetic shapes detection dataset."""
from .shapes_dataset import SyntheticShapesDataset

__all__ = ["SyntheticShapesDataset"]
