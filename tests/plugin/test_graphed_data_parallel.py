"""GraphedDataParallel: GraphedDINO's step on several processes.

On CPU, two gloo processes train the tiny DINO two steps each on batches of
their own.  The reference is torch's DistributedDataParallel around
``padded_loss`` on the same padded batches, followed by the same clipping
and AdamW update: that is the computation GraphedDINO's step makes (mmdet's
``loss``, which MMDistributedDataParallel runs, takes the batch unpadded,
with other denoising groups and draws), its gradients averaged by torch's
own reducer.  On one GPU (GPU test), a one-rank NCCL group runs the
wrapped step eagerly, captured and replayed.
"""
import msda_mm  # noqa: F401  (first: a spawned process imports this module without conftest)

# isort: split
import copy
import logging
import warnings
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from mmengine.logging import MessageHub, MMLogger
from mmengine.model import MMDistributedDataParallel, is_model_wrapper
from mmengine.registry import MODEL_WRAPPERS, init_default_scope
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from msda_mm.engine import GraphedDataParallel
from msda_mm.models.dino.padded_batch import pad_batch

from .test_graphed_dino import CANVAS, CAP, adamw_wrapper, batches, tiny_graphed_dino

RANKS, STEPS = 2, 2
# fp32 on CPU: the same operations in the same order; the 2-rank average is
# exact (a division by 2), so the runs differ at most by rounding noise.
RTOL, ATOL = 1e-5, 1e-6


class PaddedLoss(nn.Module):
    """``model.padded_loss`` as a module's forward, for DistributedDataParallel."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch):
        return self.model.padded_loss(batch)


class CountedReducer:
    """``reducer``, counting its calls."""

    def __init__(self, reducer) -> None:
        self.reducer, self.calls = reducer, 0

    def __call__(self, grads) -> None:
        self.calls += 1
        self.reducer(grads)


def rank_batches(rank: int):
    """The STEPS batches of ``rank``: other GT counts than the other rank's."""
    return batches(RANKS * STEPS)[rank::RANKS]


def off_rank0(model: nn.Module, rank: int) -> nn.Module:
    """``model`` with every parameter moved away from rank 0's values on the
    other ranks, which the wrapper's broadcast must undo."""
    with torch.no_grad():
        for param in model.parameters():
            param.add_(rank)
    return model


def step_seed(rank: int, step: int) -> None:
    # The denoising queries' draws: the same in every run of a rank and step.
    torch.manual_seed(100 * rank + step)


def wrapped_run(rank: int) -> dict:
    """GraphedDINO built through the registry's GraphedDataParallel, as
    mmengine's runner builds ``model_wrapper_cfg``."""
    model = off_rank0(tiny_graphed_dino(log_interval=1), rank)
    init_default_scope("mmdet")
    wrapped = MODEL_WRAPPERS.build(dict(type="GraphedDataParallel"),
                                   default_args=dict(module=model))
    optim_wrapper = adamw_wrapper(model)
    logs = []
    for step, batch in enumerate(rank_batches(rank)):
        step_seed(rank, step)
        logs.append(wrapped.train_step(copy.deepcopy(batch), optim_wrapper))
    return dict(logs=logs, params=[p.detach().clone() for p in model.parameters()],
                is_wrapper=is_model_wrapper(wrapped), wrapper=type(wrapped).__name__)


def ddp_reference_run(rank: int) -> dict:
    """padded_loss under torch's DistributedDataParallel, then GraphedDINO's
    clipping (max_norm 0.1, as adamw_wrapper sets) and AdamW update."""
    model = off_rank0(tiny_graphed_dino(), rank)
    ddp = DistributedDataParallel(PaddedLoss(model), broadcast_buffers=False)
    optimizer = adamw_wrapper(model).optimizer
    logs = []
    for step, batch in enumerate(rank_batches(rank)):
        inputs = model.data_preprocessor(copy.deepcopy(batch), True)
        padded = pad_batch(inputs["inputs"], inputs["data_samples"], CANVAS, CAP)
        step_seed(rank, step)
        loss, log_vars = model.parse_losses(ddp(padded))
        loss.backward()
        norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.1, norm_type=2)
        optimizer.step()
        optimizer.zero_grad()
        logs.append({**{name: value.item() for name, value in log_vars.items()},
                     "grad_norm": norm.item()})
    return dict(logs=logs, params=[p.detach().clone() for p in model.parameters()])


def unreduced_run(rank: int) -> dict:
    """GraphedDINO's step without the wrapper: each rank's own gradients."""
    model = tiny_graphed_dino(log_interval=1)
    optim_wrapper = adamw_wrapper(model)
    for step, batch in enumerate(rank_batches(rank)):
        step_seed(rank, step)
        model.train_step(copy.deepcopy(batch), optim_wrapper)
    return dict(params=[p.detach().clone() for p in model.parameters()])


def two_rank_worker(rank: int, store: str, out: str) -> None:
    torch.set_num_threads(1)
    MMLogger.get_current_instance().setLevel(logging.WARNING)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=RANKS, timeout=timedelta(minutes=5))
    try:
        torch.save(dict(wrapped=wrapped_run(rank), ddp=ddp_reference_run(rank),
                        unreduced=unreduced_run(rank)), f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_rank_results(tmp_path_factory):
    """Each rank's runs, from two spawned gloo processes (CPU, the PyTorch
    reference of the attention: TRITON_INTERPRET=0 in their environment)."""
    out = tmp_path_factory.mktemp("two_ranks")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TRITON_INTERPRET", "0")
        mp.spawn(two_rank_worker, args=(str(out / "store"), str(out)), nprocs=RANKS)
    return [torch.load(out / f"rank{rank}.pt") for rank in range(RANKS)]


def assert_close_params(ours, theirs):
    assert len(ours) == len(theirs)
    for index, (p, q) in enumerate(zip(ours, theirs)):
        torch.testing.assert_close(p, q, rtol=RTOL, atol=ATOL,
                                   msg=lambda text, index=index: f"parameter {index}: {text}")


def test_two_ranks_log_and_update_as_ddp_does(two_rank_results):
    for rank, results in enumerate(two_rank_results):
        ours, theirs = results["wrapped"], results["ddp"]
        assert ours["is_wrapper"] and ours["wrapper"] == "GraphedDataParallel"
        for step, (logged, expected) in enumerate(zip(ours["logs"], theirs["logs"])):
            assert set(logged) == set(expected) and "grad_norm" in logged, (rank, step)
            for name, value in expected.items():
                assert logged[name] == pytest.approx(value, rel=RTOL), (rank, step, name)
        assert_close_params(ours["params"], theirs["params"])


def test_the_ranks_end_with_the_same_parameters(two_rank_results):
    first, *others = [results["wrapped"]["params"] for results in two_rank_results]
    for params in others:
        for p, q in zip(first, params):
            torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_each_ranks_own_gradients_would_fail_the_comparison(two_rank_results):
    """The ranks' batches differ enough that a skipped all-reduce shows:
    without the wrapper, the parameters fail the reference's comparison."""
    for results in two_rank_results:
        with pytest.raises(AssertionError, match="Mismatched elements"):
            assert_close_params(results["unreduced"]["params"], results["ddp"]["params"])


@pytest.fixture
def one_rank_gloo(tmp_path):
    """A one-process gloo group for the test, destroyed after it."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_loss_under_mmengines_ddp_warns_once_naming_the_wrapper(reference_backend,
                                                                quiet_mmengine, one_rank_gloo):
    model = tiny_graphed_dino()
    # mmdet's label noise (the eager loss's) needs a positive scale.
    model.dn_query_generator.label_noise_scale = 0.5
    ddp = MMDistributedDataParallel(module=model)
    optim_wrapper = adamw_wrapper(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in batches(2):
            ddp.train_step(copy.deepcopy(batch), optim_wrapper)
    ours = [str(w.message) for w in caught if "GraphedDINO.loss" in str(w.message)]
    assert len(ours) == 1
    assert "model_wrapper_cfg=dict(type='GraphedDataParallel')" in ours[0]


def test_the_wrapper_refuses_what_it_cannot_wrap(quiet_mmengine, tmp_path):
    model = tiny_graphed_dino()
    with pytest.raises(RuntimeError, match="needs the default process group"):
        GraphedDataParallel(model)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        with pytest.raises(TypeError, match="train_step takes grad_reducer.*is Linear"):
            GraphedDataParallel(nn.Linear(2, 2))
        with pytest.raises(ValueError, match="bucket_cap_mb must be > 0, got 0"):
            GraphedDataParallel(model, bucket_cap_mb=0)
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_one_gpu_nccl_replays_are_the_eager_steps(quiet_mmengine, tmp_path, monkeypatch):
    """The wrapped step on a one-rank NCCL group, 5 steps: eager, captured
    (two graphs, the all-reduce between them; padded_loss's normalisers'
    all-reduces inside the first), replayed; the same logged values and
    parameters as the wrapped steps run eagerly throughout (fp32).

    Deterministic MSDA and cuDNN kernels: the two runs go 5 steps apart, and
    atomics' rounding alone moved grad_norm by 1.1e-4 relative by step 3."""
    if not torch.cuda.is_available():
        pytest.fail("GPU test run without CUDA")
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1, device_id=torch.device("cuda", 0))
    try:
        graphed = tiny_graphed_dino("cuda", deterministic=True, log_interval=5)
        eager = copy.deepcopy(graphed)
        eager.warmup_steps = 10 ** 6
        runs, reductions = [], []
        for run, model in enumerate((graphed, eager)):
            hub = MessageHub.get_instance(f"graphed_data_parallel_nccl_{run}")
            wrapped = GraphedDataParallel(model)
            wrapped.grad_reducer = CountedReducer(wrapped.grad_reducer)
            optim_wrapper = adamw_wrapper(model, fused=True)
            for batch in batches(5):
                last = wrapped.train_step(copy.deepcopy(batch), optim_wrapper)
            reductions.append(wrapped.grad_reducer.calls)
            runs.append({name: [*hub.get_scalar(f"train/{name}").data[0][-4:], value]
                         for name, value in last.items()})
    finally:
        dist.destroy_process_group()
    assert graphed.captured_keys == [(2, *CANVAS, CAP)] and eager.captured_keys == []
    assert reductions == [5, 5]
    ours, theirs = runs
    assert set(ours) == set(theirs) and {"loss", "grad_norm", "dn_loss_cls"} <= set(ours)
    for name in theirs:
        assert ours[name] == pytest.approx(theirs[name], rel=1e-4, abs=1e-5), name
    for p, q in zip(graphed.parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-3)
