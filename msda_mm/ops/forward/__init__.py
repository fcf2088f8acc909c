"""The forward: its kernels (kernels.py) and their launcher (launcher.py)."""
