"""Batched linear assignment (Hungarian matching) on the GPU: the Triton
kernel (kernel.py), its launcher (launcher.py), the input checks
(validate.py) and scipy's solution in the same format (reference.py)."""
from .launcher import linear_assignment
from .reference import linear_assignment_reference

__all__ = ["linear_assignment", "linear_assignment_reference"]
