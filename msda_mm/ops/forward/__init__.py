"""The forward: its kernels (kernels.py) and the level starts that the eager
path derives on the device (level_starts.py)."""
