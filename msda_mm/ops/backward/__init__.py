"""The backward: msda_bwd_kernel and grad_value's fill (kernels.py,
zero_fill.py) and their launcher (launcher.py); the deterministic
backward's grad_value is deterministic/'s."""
