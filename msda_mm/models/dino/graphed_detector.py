"""DINO whose training step is replayed from CUDA graphs.

``SyncFreeDINO`` already waits nowhere on the device in a step, yet its
host still runs every kernel launch of it from Python, and that is most of
the step's time.  Here each batch is padded to one of a few static shapes
(``padded_batch``), its losses computed with no host read
(``SyncFreeDINO.padded_loss``), and the whole step captured once per shape
and replayed (``msda_mm.engine.captured_steps``).
"""
from __future__ import annotations

import logging
import warnings
from contextlib import nullcontext
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from mmengine.logging import MessageHub, print_log
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from torch import Tensor

from ... import compat  # noqa: F401  (first: on mmcv-lite, mmdet.models imports only after it)

# isort: split
from mmdet.registry import MODELS

from ...engine.captured_steps import CapturedSteps, check_warmup
from ...parity.training import check_step
from .detector import SyncFreeDINO
from .head import BatchedMatchingDINOHead
from .padded_batch import PaddedBatch, bucket, pad_batch

# Averages gradients over the processes in place (GradientAllReduce).
GradReducer = Callable[[List[Tensor]], None]


class StepLogs:
    """The log vectors of training steps, read from the device once every
    ``interval`` steps (one wait) instead of once a step: the earlier steps'
    values go to the message hub as mmengine's RuntimeInfoHook would have
    put them, the last step's are returned for it to put."""

    def __init__(self, interval: int) -> None:
        if interval < 1:
            raise ValueError(f"log_interval must be >= 1, got {interval}")
        self.interval = interval
        self._pending: List[Tensor] = []

    def record(self, names: Sequence[str], values: Tensor) -> Dict[str, float]:
        # A copy: a replay's log vector is overwritten by the next replay.
        self._pending.append(values.clone())
        if len(self._pending) < self.interval:
            return {}
        rows = torch.stack(self._pending).tolist()
        self._pending.clear()
        hub = MessageHub.get_current_instance()
        for row in rows[:-1]:
            for name, value in zip(names, row):
                hub.update_scalar(f"train/{name}", value)
        return dict(zip(names, rows[-1]))

    @staticmethod
    def recorded(last: Dict[str, float], count: int) -> List[Dict[str, float]]:
        """The values of the last ``count`` steps, ``last`` being what
        ``record`` returned at the last of them: the earlier ones as it put
        them in the current message hub."""
        hub = MessageHub.get_current_instance()
        rows: List[Dict[str, float]] = [{} for _ in range(count - 1)]
        for name in last if count > 1 else ():
            for row, value in zip(rows, hub.get_scalar(f"train/{name}").data[0][-(count - 1):]):
                row[name] = float(value)
        return rows + [last]


@MODELS.register_module()
class GraphedDINO(SyncFreeDINO):
    """``SyncFreeDINO`` whose ``train_step`` runs from CUDA graphs.

    Each batch is padded to the smallest of ``canvas_sizes`` that holds it
    and its GT boxes to the smallest of ``gt_caps`` that holds the most of
    an image, which makes its shape key; the first ``warmup_steps`` steps of
    a key run eagerly, the next is captured, later ones replay.  A batch
    that fits no bucket runs eagerly (a log line says so, once per shape).
    The denoising queries come in ``num_dn_queries // G`` groups (G the
    key's cap) with mmdet's dynamic ``group_cfg`` (fewer than mmdet's
    ``// max count`` when the cap exceeds the batch's largest count), and
    their label noise draws for every query.  Losses and gradient norm are
    logged every ``log_interval`` steps (one wait on the device each time).

    The optimizer wrapper must be mmengine's OptimWrapper (fp32) or
    AmpOptimWrapper with dtype bfloat16 (fp16 would need loss scaling),
    without gradient accumulation, around torch's Adam or AdamW; the bbox
    head a BatchedMatchingDINOHead.  In a distributed run the model is
    wrapped by ``GraphedDataParallel`` (``model_wrapper_cfg``), which gives
    ``train_step`` the gradients' all-reduce; mmengine's
    MMDistributedDataParallel would call ``loss`` instead, eagerly (a
    warning says so).

    Args:
        canvas_sizes: the (H, W) canvases a batch is padded to.
        gt_caps: the GT counts per image a batch is padded to.
        warmup_steps: eager steps of each key before its capture.
        log_interval: steps between reads of the logged values (set it to
            the LoggerHook's interval).
        check_interval: every this many steps (0: never), a replayed step
            is checked: the same step then runs eagerly twice from the state
            the replay started in (``msda_mm.parity.training.check_step``),
            the replay's result kept, and a log line gives the distance of
            the replay's parameter and BN-statistics changes from the eager
            step's beside the second eager step's (the rounding's floor),
            and how much further or shorter (signed) than the eager update
            the replay's goes along it.  Each check costs two eager steps
            and waits on the device once.
    """

    def __init__(self, *args, canvas_sizes: Sequence[Tuple[int, int]] = ((800, 1333),
                                                                          (1333, 800)),
                 gt_caps: Sequence[int] = (10, 25, 50, 100), warmup_steps: int = 1,
                 log_interval: int = 50, check_interval: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.bbox_head, BatchedMatchingDINOHead):
            raise TypeError(f"GraphedDINO computes its losses with BatchedMatchingDINOHead; "
                            f"bbox_head is {type(self.bbox_head).__name__}")
        self.canvas_sizes = [tuple(int(v) for v in size) for size in canvas_sizes]
        if not self.canvas_sizes or any(len(s) != 2 or min(s) < 1 for s in self.canvas_sizes):
            raise ValueError(f"canvas_sizes must be (H, W) pairs of positive sizes, got "
                             f"{canvas_sizes!r}")
        self.gt_caps = sorted(int(g) for g in gt_caps)
        if not self.gt_caps or self.gt_caps[0] < 1:
            raise ValueError(f"gt_caps must be positive GT counts, got {gt_caps!r}")
        check_warmup("warmup_steps", warmup_steps)  # here, not at the first step
        if check_interval < 0:
            raise ValueError(f"check_interval must be >= 0 (0: no checks), got {check_interval}")
        self.warmup_steps, self.check_interval = warmup_steps, check_interval
        # Each check's step number, key and distances (check_step's), in order.
        self.replay_checks: List[dict] = []
        self._steps_taken = 0
        self._logs = StepLogs(log_interval)
        self._steps: Optional[CapturedSteps] = None
        self._wrapper: Optional[OptimWrapper] = None
        self._reducer: Optional[GradReducer] = None
        self._loss_names: List[str] = []
        self._update_names: List[str] = []
        self._eager_shapes: set = set()
        self._reported: set = set()
        self._warned_eager_loss = False

    @property
    def captured_keys(self) -> List[tuple]:
        """The (B, H, W, G) keys whose step is replayed from a graph."""
        return [] if self._steps is None else self._steps.keys

    @property
    def setup_seconds(self) -> Dict[tuple, float]:
        """Per key, the host seconds its first steps took (eager steps,
        compilation and capture)."""
        return {} if self._steps is None else dict(self._steps.setup_seconds)

    def train_step(self, data, optim_wrapper: OptimWrapper,
                   grad_reducer: Optional[GradReducer] = None) -> Dict[str, float]:
        """One training step on ``data`` (a batch from the dataloader): the
        losses and the gradient norm every ``log_interval`` steps, an empty
        dict in between.  ``grad_reducer`` (GraphedDataParallel's) averages
        the gradients over the processes in place, after backward and
        before clipping; the same one at every step."""
        steps = self._captured_steps(optim_wrapper, grad_reducer)
        data = self.data_preprocessor(data, True)
        inputs, samples = data["inputs"], data["data_samples"]
        height, width = inputs.shape[-2:]
        most = max((len(sample.gt_instances) for sample in samples), default=0)
        fit = bucket(self.canvas_sizes, self.gt_caps, height, width, most)
        if fit is None:
            fit = (height, width, max(most, 1))
            if fit not in self._eager_shapes:
                self._eager_shapes.add(fit)
                print_log(f"GraphedDINO: a batch of {height} x {width} images with up to "
                          f"{most} GT boxes fits no bucket (canvas_sizes "
                          f"{self.canvas_sizes}, gt_caps {self.gt_caps}); such steps run "
                          f"eagerly", logger="current", level=logging.WARNING)
            captured = False
        else:
            captured = inputs.is_cuda
        batch = pad_batch(inputs, samples, fit[:2], fit[2])
        if (captured and self.check_interval and batch.key in steps.keys
                and self._steps_taken % self.check_interval == 0):
            values = self._checked_replay(steps, batch)
        else:
            values = steps(batch, captured)  # names its values at its first run
        self._steps_taken += 1
        if captured and batch.key in steps.keys and batch.key not in self._reported:
            self._report_capture(steps, batch.key)
        return self._logs.record(self._loss_names + self._update_names, values)

    def _checked_replay(self, steps: CapturedSteps, batch: PaddedBatch) -> Tensor:
        device = batch.images.device
        generator = torch.cuda.default_generators[
            device.index if device.index is not None else torch.cuda.current_device()]
        # The replay's log vector copied: it lives in the graphs' memory.
        values, check = check_step(self, self._wrapper.optimizer,
                                   lambda: steps(batch, True).clone(),
                                   lambda: steps.eager(batch), generator)
        self.replay_checks.append(dict(step=self._steps_taken, key=batch.key, **check))
        print_log(f"GraphedDINO: step {self._steps_taken} (key {batch.key}) replayed and run "
                  f"eagerly twice from one state: the replay's update is "
                  f"{check['update']:.3g} from the eager one's (the second eager run's "
                  f"{check['update_floor']:.3g}), its BN statistics' change "
                  f"{check['buffers']:.3g} ({check['buffers_floor']:.3g}), relative; "
                  f"along the eager update it goes {check['update_along']:+.3g} further "
                  f"({check['update_along_floor']:+.3g})", logger="current")
        return values

    def _report_capture(self, steps: CapturedSteps, key: tuple) -> None:
        self._reported.add(key)
        gib = torch.cuda.memory_reserved(self._wrapper.optimizer.param_groups[0]["params"][0]
                                         .device) / 2**30
        print_log(f"GraphedDINO: captured the step of key (B, H, W, G) = {key}; its first "
                  f"{self.warmup_steps + 1} steps (eager, compilation, capture) took "
                  f"{steps.setup_seconds[key]:.1f} s; {len(steps.keys)} keys captured, "
                  f"{gib:.2f} GiB reserved by PyTorch's allocator", logger="current")

    def loss(self, batch_inputs: Tensor, batch_data_samples) -> Dict[str, Tensor]:
        """``SyncFreeDINO.loss``, eager.  In a distributed run only
        mmengine's MMDistributedDataParallel calls it in training, in place
        of ``train_step``: a warning (once) names the wrapper to set."""
        if not self._warned_eager_loss and dist.is_available() and dist.is_initialized():
            self._warned_eager_loss = True
            warnings.warn("GraphedDINO.loss runs in a distributed run, as mmengine's "
                          "MMDistributedDataParallel calls it: the training step runs "
                          "eagerly, not from CUDA graphs; set model_wrapper_cfg="
                          "dict(type='GraphedDataParallel') in the config", stacklevel=2)
        return super().loss(batch_inputs, batch_data_samples)

    def _captured_steps(self, optim_wrapper: OptimWrapper,
                        grad_reducer: Optional[GradReducer]) -> CapturedSteps:
        if self._steps is None:
            check_wrapper(optim_wrapper)
            if grad_reducer is not None and self.check_interval:
                # A check runs three steps where a rank without a replay runs one: their
                # gradients' reductions would not pair up.
                raise ValueError(f"GraphedDINO checks replays in one process; check_interval is "
                                 f"{self.check_interval} in a distributed run (a grad_reducer "
                                 f"was given): set it to 0")
            self._wrapper, self._reducer = optim_wrapper, grad_reducer
            self._steps = CapturedSteps(self._backward, self._update, optim_wrapper.optimizer,
                                        warmup=self.warmup_steps, reduce=grad_reducer)
        elif optim_wrapper is not self._wrapper:
            raise ValueError("GraphedDINO.train_step was given another optim_wrapper than "
                             "at its first step (its graphs update that one's optimizer)")
        elif grad_reducer is not self._reducer:
            raise ValueError("GraphedDINO.train_step was given another grad_reducer than at "
                             "its first step (its steps call that one between backward and "
                             "update)")
        return self._steps

    def _backward(self, batch: PaddedBatch) -> Tensor:
        """Forward, losses and backward on ``batch``; the losses as one
        float32 vector."""
        wrapper = self._wrapper
        dtype = getattr(wrapper, "cast_dtype", None)
        autocast = (nullcontext() if dtype is None else
                    torch.autocast(batch.images.device.type, dtype=dtype, cache_enabled=False))
        with autocast:
            losses = self.padded_loss(batch)
        loss, log_vars = self.parse_losses(losses)
        loss.backward()
        self._loss_names = list(log_vars)
        return torch.stack([value.detach().float().reshape(()) for value in log_vars.values()])

    def _update(self) -> Tensor:
        """Clipping and the optimizer's update; the gradient norm as a
        float32 vector (empty without one)."""
        wrapper = self._wrapper
        params = [p for group in wrapper.optimizer.param_groups for p in group["params"]
                  if p.requires_grad and p.grad is not None]
        norm = None
        if wrapper.clip_grad_kwargs:
            norm = wrapper.clip_func(params, **wrapper.clip_grad_kwargs)  # clip_grad_value_: None
        wrapper.optimizer.step()
        if norm is None:
            self._update_names = []
            return params[0].new_zeros(0, dtype=torch.float32)
        self._update_names = [wrapper.grad_name]  # an attribute only with clip_grad
        return norm.float().reshape(1)


def check_wrapper(optim_wrapper) -> None:
    """TypeError/ValueError unless GraphedDINO can capture
    ``optim_wrapper``'s update."""
    if type(optim_wrapper) not in (OptimWrapper, AmpOptimWrapper):
        raise TypeError(f"GraphedDINO captures the update of an OptimWrapper or "
                        f"AmpOptimWrapper, got {type(optim_wrapper).__name__}")
    if isinstance(optim_wrapper, AmpOptimWrapper) and optim_wrapper.cast_dtype != torch.bfloat16:
        raise ValueError(f"GraphedDINO trains in fp32 or bf16 AMP (no loss scaling); "
                         f"AmpOptimWrapper has dtype {optim_wrapper.cast_dtype}")
    if optim_wrapper._accumulative_counts != 1:
        raise ValueError(f"GraphedDINO updates every step; optim_wrapper accumulates "
                         f"{optim_wrapper._accumulative_counts} steps")
