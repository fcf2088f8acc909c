"""The forward: its kernels (kernels.py), their launcher (launcher.py) and
the level starts that the eager path derives on the device
(level_starts.py)."""
