"""mmengine's CheckpointHook whose checkpoints are saved atomically with a
sha256 beside each, and checked before the Runner loads one."""
from __future__ import annotations

import glob
import os.path as osp

from mmdet.registry import HOOKS
from mmengine.hooks import CheckpointHook
from mmengine.runner.checkpoint import find_latest_checkpoint

from .checkpoint_integrity import DamagedCheckpointError, checkpoint_problem
from .verified_backend import BACKEND


@HOOKS.register_module()
class VerifiedCheckpointHook(CheckpointHook):
    """CheckpointHook (same arguments, same files) that writes each
    checkpoint to a temporary name, renames it and writes ``<ckpt>.sha256``
    beside it; and, before the Runner loads (``load_from``, ``resume``,
    ``Runner.test``):

    * a damaged ``load_from`` or named resume checkpoint raises
      DamagedCheckpointError naming the file and the newest whole checkpoint
      beside it;
    * an automatic resume (``resume=True``, no ``load_from``) takes the
      newest whole checkpoint of the work dir, warning which files it
      passed over, and raises FileNotFoundError naming the work dir when it
      has none, unless ``start_if_nothing_to_resume=True`` (then it warns
      that training starts from scratch).

    Args:
        start_if_nothing_to_resume (bool): see above.  Defaults to False.
        **kwargs: CheckpointHook's arguments, but not ``backend_args`` or
            ``file_client_args``: the files are local.
    """

    def __init__(self, *args, start_if_nothing_to_resume: bool = False, **kwargs):
        for key in ("backend_args", "file_client_args"):
            if kwargs.get(key) is not None:
                raise ValueError(f"VerifiedCheckpointHook writes local files: {key} must be "
                                 f"None, got {kwargs[key]!r}")
        kwargs["backend_args"] = dict(backend=BACKEND)
        super().__init__(*args, **kwargs)
        self.start_if_nothing_to_resume = start_if_nothing_to_resume

    def before_run(self, runner) -> None:
        # mmengine 0.10's Runner keeps what load_or_resume (called right
        # after before_run) will load in these; it has no public setter.
        if runner._has_loaded:
            return
        if runner._resume and runner._load_from is None:
            runner._load_from = self._newest_whole(runner)
            runner._resume = runner._load_from is not None
        elif runner._load_from is not None and osp.isfile(runner._load_from):
            self._check_named(runner._load_from, "resume from" if runner._resume else "load_from")

    def _saved(self, folder: str, but: str | None = None) -> list[str]:
        """This hook's checkpoints in ``folder``, newest first (by time: a
        rerun's files are newer than a longer earlier run's last ones)."""
        pattern = osp.join(glob.escape(folder), self.filename_tmpl.format("*"))
        found = [p for p in glob.glob(pattern) if but is None or not osp.samefile(p, but)]
        return sorted(found, key=osp.getmtime, reverse=True)

    def _check_named(self, path: str, role: str) -> None:
        problem = checkpoint_problem(path)
        if problem is None:
            return
        whole = next((p for p in self._saved(osp.dirname(path), but=path)
                      if checkpoint_problem(p) is None), None)
        offer = (f"the newest whole checkpoint beside it is {whole}" if whole else
                 "no other checkpoint beside it is whole")
        raise DamagedCheckpointError(f"{role} {path}: damaged checkpoint, {problem}; {offer}")

    def _newest_whole(self, runner) -> str | None:
        latest = find_latest_checkpoint(runner.work_dir)
        folder = (osp.dirname(latest) if latest else runner.work_dir if self.out_dir is None
                  else osp.join(self.out_dir, osp.basename(runner.work_dir)))
        candidates = [latest] if latest else []
        candidates += self._saved(folder, but=latest if latest and osp.isfile(latest) else None)
        damaged = []
        for path in candidates:
            problem = checkpoint_problem(path)
            if problem is None:
                if damaged:
                    runner.logger.warning(
                        f"Resuming from {path}, the newest whole checkpoint: passed over "
                        + "; ".join(f"{p} ({why})" for p, why in damaged))
                return path
            damaged.append((path, problem))
        if damaged:
            raise DamagedCheckpointError(
                f"resume: no whole checkpoint in {folder}: "
                + "; ".join(f"{p}: {why}" for p, why in damaged))
        if not self.start_if_nothing_to_resume:
            raise FileNotFoundError(
                f"resume: nothing to resume in {runner.work_dir} (no last_checkpoint file, no "
                f"{self.filename_tmpl.format('*')} in {folder}). Train without resume to start "
                f"from scratch, or set start_if_nothing_to_resume=True on {type(self).__name__} "
                f"(tools/train.py: --start-if-nothing-to-resume) to start from scratch whenever "
                f"there is nothing to resume")
        runner.logger.warning(f"resume: nothing to resume in {runner.work_dir}; training starts "
                              f"from scratch (start_if_nothing_to_resume=True)")
        return None
