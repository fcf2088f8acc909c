"""``StopLoaderWorkersHook``: the run's DataLoader workers stopped as it ends.

For each persistent worker of a loader that pins memory, torch 2.11's
DataLoader registers an exit handler that joins the worker with a 5 s
timeout without first telling it to stop, so each join waits out its
timeout: a run with 6 training workers exited 35 s after its last log
line (another run's main thread, its stack dumped 15 s after its last log
line, was in that join; torch 2.13 stops the workers first).  Stopped
here, the way the loader's own iterator stops them, the join finds them
gone::

    custom_hooks = [dict(type='StopLoaderWorkersHook')]
"""
from __future__ import annotations

from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from mmengine.runner import BaseLoop
from torch.utils.data import DataLoader


def stop_loader_workers(loader: DataLoader) -> bool:
    """Stop the worker processes ``loader`` keeps between epochs
    (``persistent_workers=True``); returns whether it had any running.
    The loader stays usable: its next epoch starts new workers."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is None or not hasattr(iterator, "_shutdown_workers"):
        return False
    loader._iterator = None
    iterator._shutdown_workers()
    return True


@HOOKS.register_module()
class StopLoaderWorkersHook(Hook):
    """After the run (train, val or test), stops the workers of every
    loop's loader that the run built."""

    priority = "LOWEST"

    def after_run(self, runner) -> None:
        # mmengine's Runner keeps a loop it never built as its config (its
        # train_loop property would build it now): only built loops are read.
        for name in ("_train_loop", "_val_loop", "_test_loop"):
            loop = getattr(runner, name, None)
            if isinstance(loop, BaseLoop):
                stop_loader_workers(loop.dataloader)
