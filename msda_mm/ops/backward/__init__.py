"""The backward: msda_bwd_kernel and grad_value's fill (kernels.py)."""
