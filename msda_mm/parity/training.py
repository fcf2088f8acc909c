"""Training steps outside mmengine's train loop, on the Runner's own builders:
what the parity and profiling tools run instead of ``Runner.train()``, so that
they control each iteration (reseed, swap the MSDA op, time, profile).

Each call of ``start`` gives a fresh optimizer and a fresh, seeded data
order from the same config, so two runs from the same weights and seed see
the same batches in the same order and the same random draws.  Parameter
schedulers are not stepped: both sides of a comparison keep the config's
initial learning rate.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Iterator, NamedTuple

import torch
from mmengine.config import Config
from mmengine.optim import OptimWrapper
from mmengine.runner import Runner, set_random_seed
from torch.utils.data import DataLoader


def _forever(loader: DataLoader) -> Iterator[dict]:
    """The loader's batches, epoch after epoch, each epoch's order set by the
    sampler's seed and epoch number as in mmengine's loops."""
    epoch = 0
    while True:
        for sampler in (loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
                break
        yield from loader
        epoch += 1


def start(runner: Runner, cfg: Config, seed: int) -> tuple[OptimWrapper, Iterator[dict]]:
    """Reseed every generator, then build the config's optimizer wrapper for
    ``runner.model`` and an endless iterator over its train dataloader."""
    set_random_seed(seed)
    optim_wrapper = runner.build_optim_wrapper(copy.deepcopy(cfg.optim_wrapper))
    loader = runner.build_dataloader(copy.deepcopy(cfg.train_dataloader), seed=seed)
    runner.model.train()
    return optim_wrapper, _forever(loader)


def init_weights(runner: Runner, cfg: Config) -> None:
    """The weights ``Runner.train()`` would start from: the model's own
    initialisation, then ``load_from`` if the config names a checkpoint."""
    runner.model.init_weights()
    if cfg.get("load_from"):
        runner.load_checkpoint(cfg.load_from)


def losses(log_vars: dict) -> dict[str, float]:
    """``train_step``'s log variables as floats (one host sync each)."""
    return {k: float(v.item() if isinstance(v, torch.Tensor) else v) for k, v in log_vars.items()}


def flat_parameters(model: torch.nn.Module) -> torch.Tensor:
    """``model``'s parameters as one flat vector (a copy)."""
    return torch.cat([p.detach().flatten() for p in model.parameters()])


class TrainingState(NamedTuple):
    """A copy of a model's state_dict values and of its optimizer's state,
    per parameter in the optimizer's groups' order (empty: none yet)."""

    tensors: list
    optimizer: list


def _params(optimizer: torch.optim.Optimizer) -> list:
    return [p for group in optimizer.param_groups for p in group["params"]]


def training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> TrainingState:
    """A copy of ``model``'s parameters and buffers and ``optimizer``'s state
    (on their device: taking it does not wait)."""
    return TrainingState(
        tensors=[t.detach().clone() for t in model.state_dict().values()],
        optimizer=[{name: value.clone() for name, value in optimizer.state.get(p, {}).items()}
                   for p in _params(optimizer)])


def load_training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        state: TrainingState) -> None:
    """``model`` and ``optimizer`` set to ``state``, taken of a model of the
    same config with its optimizer over the same groups: the parameters,
    buffers and the optimizer's existing state tensors in place (a captured
    CUDA graph keeps reading and writing those very tensors), state the
    optimizer lacks as copies, none where ``state`` has none."""
    for mine, theirs in zip(model.state_dict().values(), state.tensors, strict=True):
        mine.copy_(theirs)
    for param, saved in zip(_params(optimizer), state.optimizer, strict=True):
        if not saved:
            optimizer.state.pop(param, None)
            continue
        kept = optimizer.state[param]
        for name, value in saved.items():
            if isinstance(kept.get(name), torch.Tensor) and kept[name].shape == value.shape:
                kept[name].copy_(value)
            else:
                kept[name] = value.clone()


def copy_training_state(source: torch.nn.Module, source_optimizer: torch.optim.Optimizer,
                        target: torch.nn.Module, target_optimizer: torch.optim.Optimizer) -> None:
    """``target`` and its optimizer set to ``source``'s state (load_training_state)."""
    load_training_state(target, target_optimizer, training_state(source, source_optimizer))


def state_names(model: torch.nn.Module) -> tuple[list, list]:
    """The state_dict keys of ``model``'s parameters and of its persistent
    floating-point buffers (BN's running statistics)."""
    saved = model.state_dict()
    return ([name for name, _ in model.named_parameters()],
            [name for name, buffer in model.named_buffers()
             if buffer.is_floating_point() and name in saved])


def flat_tensors(model: torch.nn.Module, state: TrainingState | None, names: list) -> torch.Tensor:
    """The state_dict entries ``names`` of ``model`` (its own with ``state``
    None, else those ``state`` holds) as one flat float32 vector."""
    values = (model.state_dict() if state is None
              else dict(zip(model.state_dict().keys(), state.tensors)))
    return torch.cat([values[name].detach().flatten().float() for name in names] or
                     [torch.zeros(0, device=next(model.parameters()).device)])


def relative_distances(pairs) -> list[float]:
    """||a - b|| / ||b|| (0 where both are 0) of each pair (a, b), read from
    the device at once."""
    return torch.stack([(a - b).norm() / b.norm().clamp_min(1e-30) for a, b in pairs]).tolist()


def relative_along(pairs) -> list[float]:
    """<a - b, b> / ||b||^2 (0 where b is 0) of each pair (a, b): how much
    further than b (negative: shorter) a goes along b's direction, signed,
    which a distance cannot tell; read from the device at once."""
    return torch.stack([torch.dot(a - b, b) / b.square().sum().clamp_min(1e-30)
                        for a, b in pairs]).tolist()


def check_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               step: Callable[[], Any], eager_step: Callable[[], Any],
               generator: torch.Generator) -> tuple[Any, dict]:
    """``step()`` run and checked against ``eager_step()``, which runs twice
    from the state ``step()`` started in (``model``'s parameters and
    buffers, ``optimizer``'s state and ``generator``'s, so that both draw
    the same random numbers); ``model``, ``optimizer`` and ``generator`` are
    then left as ``step()`` left them.  Returns step()'s result and the
    distances, each relative to the first eager step's change: of step()'s
    change of the parameters from it (``update``) and of the second eager
    step's (``update_floor``: what the run-to-run rounding alone gives), and
    the same of the floating-point buffers (``buffers``, ``buffers_floor``);
    and, signed, how much further than the first eager step's each goes
    along its update's direction (``update_along``, ``update_along_floor``,
    relative_along): rounding scatters it about 0 from check to check,
    a step that updates systematically more or less keeps one sign."""
    names = state_names(model)
    start, draws = training_state(model, optimizer), generator.get_state()
    result = step()
    ends = [training_state(model, optimizer)]
    ended_draws = generator.get_state()
    for _ in range(2):
        load_training_state(model, optimizer, start)
        generator.set_state(draws)
        eager_step()
        ends.append(training_state(model, optimizer))
    load_training_state(model, optimizer, ends[0])
    generator.set_state(ended_draws)
    # Per kind (parameters, buffers): the change each run made.
    changes = []
    for kind in names:
        begun = flat_tensors(model, start, kind)
        changes.append([flat_tensors(model, end, kind) - begun for end in ends])
    (stepped, eager, again), (stepped_buffers, eager_buffers, again_buffers) = changes
    distances = relative_distances([(stepped, eager), (again, eager),
                                    (stepped_buffers, eager_buffers),
                                    (again_buffers, eager_buffers)])
    along = relative_along([(stepped, eager), (again, eager)])
    return result, dict(zip(("update", "update_floor", "buffers", "buffers_floor",
                             "update_along", "update_along_floor"), distances + along))
