"""GraphedDINO's training step: on CPU it runs eagerly and logs every
log_interval steps what the step computed; on CUDA (GPU tests) a step
replayed from its graph gives the losses and parameters of the same step run
eagerly, and waits nowhere on the device between log reads."""
import copy
import uuid

import pytest
import torch
from mmdet.testing import demo_mm_inputs
from mmengine.config import Config
from mmengine.logging import MessageHub
from mmengine.optim import AmpOptimWrapper, OptimWrapper

from msda_mm.engine import compile_submodules
from msda_mm.models import GraphedDINO
from msda_mm.models.dino import graphed_detector
from msda_mm.models.dino.padded_batch import pad_batch
from msda_mm.parity.training import copy_training_state, flat_parameters

from .detr_configs import build_detector
from .test_sync_free_dino import CONFIGS

CANVAS, CAP = (64, 64), 4
# What the graphed configs' CompileSubmodulesHook compiles.
COMPILED_LAYERS = Config.fromfile(str(CONFIGS / "_recipe.py")).compile_layers_hook["modules"]


def tiny_graphed_dino(device: str = "cpu", deterministic: bool = False, compiled: bool = False,
                      noise: bool = False, **kwargs) -> GraphedDINO:
    """The CPU demo's DINO as GraphedDINO on one bucket (64 x 64, 4 boxes);
    the denoising noise all but off unless ``noise`` (mmdet's scales);
    ``deterministic``: the MSDA layers sum grad_value without atomics;
    ``compiled``: the graphed configs' compiled losses and layers."""
    model = Config.fromfile(str(CONFIGS / "synthetic" / "dino_tiny_cpu.py")).model
    model.type = "GraphedDINO"
    model.data_preprocessor.type = "SyncFreeDetDataPreprocessor"
    model.bbox_head.type = "BatchedMatchingDINOHead"
    if not noise:
        model.dn_cfg.update(label_noise_scale=0.0, box_noise_scale=1e-9)
    model.encoder.layer_cfg.self_attn_cfg.deterministic = deterministic
    model.decoder.layer_cfg.cross_attn_cfg.deterministic = deterministic
    model.bbox_head.compile_losses = compiled
    model.update(dict(dict(canvas_sizes=[CANVAS], gt_caps=[CAP]), **kwargs))
    torch.manual_seed(0)
    detector = build_detector(model)
    detector.init_weights()
    if compiled:
        compile_submodules(detector, COMPILED_LAYERS)
    return detector.to(device).train()


def batches(count: int):
    """``count`` batches of 2 images (64 x 64 and 48 x 64) and their GT boxes."""
    return [demo_mm_inputs(batch_size=2, image_shapes=[(3, 64, 64), (3, 48, 64)],
                           num_items=[3, 1 + i % 3], num_classes=6) for i in range(count)]


def adamw_wrapper(model, amp: bool = False, lr: float = 1e-4, **optimizer):
    optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=1e-4, **optimizer)
    if amp:
        return AmpOptimWrapper(optimizer=optim, dtype="bfloat16",
                               clip_grad=dict(max_norm=0.1, norm_type=2))
    return OptimWrapper(optimizer=optim, clip_grad=dict(max_norm=0.1, norm_type=2))


def test_logs_every_interval_what_the_step_computed(reference_backend, quiet_mmengine):
    model = tiny_graphed_dino(log_interval=2)
    twin = copy.deepcopy(model)
    wrapper = adamw_wrapper(model)
    hub = MessageHub.get_instance("graphed_dino_logs")
    data = batches(2)
    # What the two steps compute, by hand on the twin.
    expected = []
    twin_wrapper = adamw_wrapper(twin)
    for batch in data:
        inputs = twin.data_preprocessor(copy.deepcopy(batch), True)
        torch.manual_seed(3)
        loss, log_vars = twin.parse_losses(twin.padded_loss(
            pad_batch(inputs["inputs"], inputs["data_samples"], CANVAS, CAP)))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(twin.parameters(), max_norm=0.1, norm_type=2)
        twin_wrapper.optimizer.step()
        twin_wrapper.optimizer.zero_grad()
        expected.append({**{k: v.item() for k, v in log_vars.items()}, "grad_norm": norm.item()})
    torch.manual_seed(3)
    assert model.train_step(copy.deepcopy(data[0]), wrapper) == {}
    torch.manual_seed(3)
    logged = model.train_step(copy.deepcopy(data[1]), wrapper)
    assert {"loss", "loss_cls", "dn_loss_iou", "grad_norm"} <= set(logged)
    assert set(logged) == set(expected[1])
    for name, value in expected[1].items():
        assert logged[name] == pytest.approx(value, rel=1e-5), name
    first = hub.get_scalar("train/loss")
    assert first.data[0][-1] == pytest.approx(expected[0]["loss"], rel=1e-5)
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_recorded_gives_back_every_step_of_an_interval():
    hub = MessageHub.get_instance("graphed_dino_recorded")
    hub.update_scalar("train/loss", 99.0)  # an earlier interval's
    logs = graphed_detector.StepLogs(3)
    steps = [logs.record(["loss", "grad_norm"], torch.tensor([float(i), 10.0 + i]))
             for i in range(3)]
    assert steps[:2] == [{}, {}]
    assert graphed_detector.StepLogs.recorded(steps[2], 3) == [
        dict(loss=0.0, grad_norm=10.0), dict(loss=1.0, grad_norm=11.0),
        dict(loss=2.0, grad_norm=12.0)]
    assert graphed_detector.StepLogs.recorded(steps[2], 1) == [steps[2]]


def test_without_clipping_it_logs_the_losses_only(reference_backend, quiet_mmengine):
    model = tiny_graphed_dino(log_interval=1)
    wrapper = OptimWrapper(optimizer=torch.optim.AdamW(model.parameters(), lr=1e-4))
    logged = model.train_step(copy.deepcopy(batches(1)[0]), wrapper)
    assert "grad_norm" not in logged and {"loss", "dn_loss_iou"} <= set(logged)


def test_refuses_what_it_cannot_capture(quiet_mmengine):
    model = tiny_graphed_dino()
    data = batches(1)[0]
    # mmengine builds an AmpOptimWrapper only where there is a GPU: its fields by hand.
    fp16 = AmpOptimWrapper.__new__(AmpOptimWrapper)
    fp16.optimizer, fp16.cast_dtype = torch.optim.AdamW(model.parameters()), torch.float16
    fp16._accumulative_counts = 1
    with pytest.raises(ValueError, match="fp32 or bf16 AMP"):
        model.train_step(copy.deepcopy(data), fp16)
    model = tiny_graphed_dino()
    sgd = OptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(TypeError, match="the optimizer is SGD"):
        model.train_step(copy.deepcopy(data), sgd)
    model = tiny_graphed_dino()
    accumulating = OptimWrapper(optimizer=torch.optim.AdamW(model.parameters()),
                                accumulative_counts=2)
    with pytest.raises(ValueError, match="accumulates 2 steps"):
        model.train_step(copy.deepcopy(data), accumulating)
    with pytest.raises(ValueError, match="gt_caps must be positive"):
        tiny_graphed_dino(gt_caps=[0])
    with pytest.raises(ValueError, match="canvas_sizes must be"):
        tiny_graphed_dino(canvas_sizes=[(64,)])
    with pytest.raises(ValueError, match="log_interval must be >= 1"):
        tiny_graphed_dino(log_interval=0)
    with pytest.raises(ValueError, match="warmup_steps must be >= 1"):
        tiny_graphed_dino(warmup_steps=0)
    with pytest.raises(ValueError, match="check_interval must be >= 0"):
        tiny_graphed_dino(check_interval=-1)
    model = tiny_graphed_dino(check_interval=10)
    with pytest.raises(ValueError, match="checks replays in one process"):
        model.train_step(copy.deepcopy(data), adamw_wrapper(model), grad_reducer=lambda _: None)


def test_a_batch_outside_the_buckets_runs_eagerly_and_says_so(reference_backend,
                                                              quiet_mmengine, monkeypatch):
    messages = []
    monkeypatch.setattr(graphed_detector, "print_log", lambda msg, **_: messages.append(msg))
    model = tiny_graphed_dino(log_interval=1)
    wrapper = adamw_wrapper(model)
    big = demo_mm_inputs(batch_size=2, image_shapes=[(3, 80, 64)] * 2, num_items=[2, 6],
                         num_classes=6)
    for _ in range(2):
        logged = model.train_step(copy.deepcopy(big), wrapper)
        assert torch.isfinite(torch.tensor(logged["loss"]))
    assert model.captured_keys == []
    assert len(messages) == 1
    assert "a batch of 80 x 64 images with up to 6 GT boxes fits no bucket" in messages[0]


@pytest.mark.gpu
# bf16: Adam turns bf16's rounding into different updates (about lr * sign(g)
# where g is near 0), so the learning rate is 0 and the test checks the
# replayed forward and losses in bf16 on the same parameters.
@pytest.mark.parametrize("amp, lr, rtol", [(False, 1e-4, 1e-4), (True, 0.0, 1e-2)],
                         ids=["fp32", "bf16"])
def test_replayed_steps_are_the_eager_steps_on_cuda(amp, lr, rtol, quiet_mmengine, monkeypatch):
    """5 steps with the graph (warm-up 1: eager, capture, replays), each
    beside the same step run eagerly: the same logged values and updates;
    the replays wait nowhere on the device (the values are read at the
    fifth step only); the capture is reported once, with its time."""
    messages = []
    monkeypatch.setattr(graphed_detector, "print_log", lambda msg, **_: messages.append(msg))
    graphed, eager = compare_with_eager(batches(5), amp, lr, rtol, quiet_steps=(2, 3),
                                        monkeypatch=monkeypatch)
    assert graphed.captured_keys == [(2, *CANVAS, CAP)]
    assert eager.captured_keys == []
    assert len(messages) == 1
    assert f"captured the step of key (B, H, W, G) = {(2, *CANVAS, CAP)}" in messages[0]
    assert graphed.setup_seconds[(2, *CANVAS, CAP)] > 0


@pytest.mark.gpu
def test_two_keys_replayed_in_turn_are_the_eager_steps_on_cuda(quiet_mmengine, monkeypatch):
    """Two shape keys in turn (A, B, A, B, ...: each eager, captured, then
    replayed between the other's replays, in one shared memory pool): each
    of the 8 steps logs and updates what the same step run eagerly does."""
    small, large = batches(4), [
        demo_mm_inputs(batch_size=2, image_shapes=[(3, 96, 80), (3, 80, 96)],
                       num_items=[2, 1 + i % 3], num_classes=6) for i in range(4)]
    data = [batch for pair in zip(small, large) for batch in pair]
    graphed, _ = compare_with_eager(data, amp=False, lr=1e-4, rtol=1e-4, quiet_steps=(4, 5, 6),
                                    monkeypatch=monkeypatch, canvas_sizes=[CANVAS, (96, 96)])
    assert graphed.captured_keys == [(2, *CANVAS, CAP), (2, 96, 96, CAP)]


@pytest.mark.gpu
def test_replays_of_other_image_sizes_in_the_canvas_are_the_eager_steps_on_cuda(quiet_mmengine,
                                                                               monkeypatch):
    """Images of other sizes at every step, all padded to the one canvas (as
    DINO's multi-scale resize fills a bucket): each replay reads its batch's
    sizes (the padding masks, valid ratios and box normalisers), so each
    step logs and updates what the same step run eagerly does."""
    sizes = [[(3, 64, 64), (3, 48, 64)], [(3, 40, 56), (3, 64, 32)], [(3, 60, 60), (3, 64, 48)],
             [(3, 32, 64), (3, 56, 40)], [(3, 64, 64), (3, 64, 64)]]
    data = [demo_mm_inputs(batch_size=2, image_shapes=shapes, num_items=[2, 1 + i % 3],
                           num_classes=6) for i, shapes in enumerate(sizes)]
    graphed, _ = compare_with_eager(data, amp=False, lr=1e-4, rtol=1e-4, quiet_steps=(2, 3),
                                    monkeypatch=monkeypatch)
    assert graphed.captured_keys == [(2, *CANVAS, CAP)]


@pytest.mark.gpu
def test_the_compiled_recipe_replays_the_eager_steps_on_cuda(quiet_mmengine, monkeypatch):
    """The graphed configs' recipe, its losses and transformer layers
    compiled by torch.compile and captured with the rest: each replay logs
    and updates what the same compiled step run eagerly does."""
    compare_with_eager(batches(5), amp=False, lr=1e-4, rtol=1e-4, quiet_steps=(2, 3),
                       monkeypatch=monkeypatch, compiled=True)


def evaluate(model) -> list:
    """One eager prediction on images of another size than the training
    canvas and of its size, in eval mode, as a run evaluates between
    epochs: each image's (scores, labels, bboxes)."""
    data = model.data_preprocessor(demo_mm_inputs(
        batch_size=2, image_shapes=[(3, 80, 96), (3, *CANVAS)], num_items=[2, 1],
        num_classes=6), False)
    model.eval()
    with torch.no_grad():
        samples = model.predict(data["inputs"], data["data_samples"])
    model.train()
    return [(p.pred_instances.scores, p.pred_instances.labels, p.pred_instances.bboxes)
            for p in samples]


def test_the_evaluation_helper_predicts_and_leaves_training_on(reference_backend, quiet_mmengine):
    model = tiny_graphed_dino()
    predictions = evaluate(model)
    assert model.training
    assert len(predictions) == 2 and all(len(scores) > 0 for scores, _, _ in predictions)


@pytest.mark.gpu
def test_evaluations_between_replays_leave_them_the_eager_steps_on_cuda(quiet_mmengine,
                                                                       monkeypatch):
    """An evaluation after the capture and another between replays (eager,
    other image sizes, its own allocations and level tensors): each later
    replay still logs and updates what the same step run eagerly does, and
    the replayed model, evaluated at the end, predicts what the eager twin
    predicts with the same parameters and buffers."""
    graphed, twin = compare_with_eager(
        batches(6), amp=False, lr=1e-4, rtol=1e-4, quiet_steps=(2, 4), monkeypatch=monkeypatch,
        after_step=lambda model, i: evaluate(model) if i in (1, 3) else None)
    twin.load_state_dict(graphed.state_dict())
    for ours, theirs in zip(evaluate(graphed), evaluate(twin), strict=True):
        for mine, other in zip(ours, theirs, strict=True):
            torch.testing.assert_close(mine, other, rtol=1e-5, atol=1e-5)


# The graphed configs' MSDA backward: grad_value summed by atomics (native bf16
# ones under bf16 AMP on sm_90) right behind its fill, which a graph captures
# with the fill's early launch of the backward (PDL).
@pytest.mark.parametrize("amp, lr, rtol", [(False, 1e-4, 1e-4), (True, 0.0, 1e-2)],
                         ids=["fp32", "bf16"])
@pytest.mark.gpu
def test_replays_with_the_atomic_backward_are_the_eager_steps_on_cuda(amp, lr, rtol,
                                                                      quiet_mmengine,
                                                                      monkeypatch):
    compare_with_eager(batches(5), amp, lr, rtol, quiet_steps=(2, 3), monkeypatch=monkeypatch,
                       atomics=True)


@pytest.mark.gpu
def test_replays_with_denoising_noise_are_the_eager_steps_on_cuda(quiet_mmengine, monkeypatch):
    """mmdet's denoising noise on: a replay draws what the eager step draws
    from the same state of the generator, so each step logs and updates
    what the same step run eagerly does; a replay whose noise were drawn
    otherwise (other offsets, or shared between its draws) would not."""
    compare_with_eager(batches(5), amp=False, lr=1e-4, rtol=1e-4, quiet_steps=(2, 3),
                       monkeypatch=monkeypatch, noise=True)


@pytest.mark.gpu
def test_checked_replays_are_at_the_eager_steps_on_cuda(quiet_mmengine, monkeypatch):
    """check_interval=1: every replay (steps 2-5) is checked against the same
    step run eagerly twice from its state: with deterministic kernels all
    three agree up to rounding, the check is logged, and the run goes on
    from the replay's result, as the same run without checks does."""
    if not torch.cuda.is_available():
        pytest.fail("GPU test run without CUDA")
    messages = []
    monkeypatch.setattr(graphed_detector, "print_log", lambda msg, **_: messages.append(msg))
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    data = batches(6)
    runs = []
    for interval in (1, 0):
        model = tiny_graphed_dino("cuda", deterministic=True, log_interval=1, noise=True,
                                  check_interval=interval)
        wrapper = adamw_wrapper(model, lr=1e-4, fused=True)
        torch.cuda.manual_seed(0)
        runs.append(([model.train_step(copy.deepcopy(batch), wrapper) for batch in data],
                     flat_parameters(model), model))
    (checked, checked_params, model), (plain, plain_params, _) = runs
    assert [c["step"] for c in model.replay_checks] == [2, 3, 4, 5]
    for check in model.replay_checks:
        assert check["key"] == (2, *CANVAS, CAP)
        assert check["update"] <= 1e-2 and check["update_floor"] <= 1e-2, check
        assert check["buffers"] <= 1e-3 and check["buffers_floor"] <= 1e-3, check
    assert sum("replayed and run eagerly twice" in m for m in messages) == 4
    for ours, theirs in zip(checked, plain, strict=True):
        assert ours == pytest.approx(theirs, rel=1e-4, abs=1e-6)
    assert (checked_params - plain_params).norm() <= 1e-2 * plain_params.norm()


def test_strays_names_a_small_tensor_left_out_of_an_update():
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 16))
    lr = 1e-4
    theirs = lr * torch.randn(sum(p.numel() for p in model.parameters())).sign()
    flipped = theirs.clone()
    flipped[:1000] *= -1  # Adam's sign flips in the first weight
    flipped[-1] *= -1  # and in the last bias
    assert strays(model, flipped, theirs, lr) == []
    stale = theirs.clone()
    stale[-16:] = 0  # the last bias not updated
    assert (stale - theirs).norm() <= 1e-2 * theirs.norm()  # which the norm cannot tell
    assert strays(model, stale, theirs, lr) == ["1.bias"]


@pytest.mark.gpu
def test_replays_draw_fresh_denoising_noise_on_cuda(quiet_mmengine):
    """mmdet's denoising noise on, learning rate 0, five steps on one batch
    (eager, captured, replayed): every step draws other noise, so each
    logs another denoising loss (a replay that reused its capture's draws
    would log the same loss, bit for bit), while the matching queries,
    which the attention mask keeps from the noised ones, log one loss."""
    if not torch.cuda.is_available():
        pytest.fail("GPU test run without CUDA")
    model = tiny_graphed_dino("cuda", log_interval=1, noise=True)
    wrapper = adamw_wrapper(model, lr=0.0, fused=True)
    batch = batches(1)[0]
    logged = [model.train_step(copy.deepcopy(batch), wrapper) for _ in range(5)]
    assert model.captured_keys == [(2, *CANVAS, CAP)]
    dn_losses = [step["dn_loss_bbox"] for step in logged]
    assert len(set(dn_losses)) == 5, dn_losses
    for step in logged[1:]:
        assert step["loss_bbox"] == pytest.approx(logged[0]["loss_bbox"], rel=1e-4)


def compare_with_eager(data, amp, lr, rtol, quiet_steps, monkeypatch, after_step=None,
                       atomics=False, **model):
    """Train a tiny GraphedDINO on ``data`` (logged once, at the end) beside an
    eager twin (never captured, logged every step) that starts each step
    from the graphed model's parameters and optimizer state; assert that
    each step logs the same values and makes the same update (parameters
    and buffers: the BN layers' running statistics), and that the
    ``quiet_steps`` of the graphed run wait nowhere on the device.
    ``after_step(graphed, i)``, if given, runs after the graphed model's step i.

    Step by step from one state (parameters, optimizer state and CUDA's
    random generator, so that the denoising noise is the same draws), with
    deterministic MSDA and cuDNN kernels (``atomics``: the MSDA backward
    that training runs, grad_value summed by atomics behind its fill), so
    that no rounding difference carries over between steps, where Adam's
    normalised updates and the matching's near ties would grow it past any
    tolerance that still tells a wrong replay.  Returns (graphed, twin)."""
    if not torch.cuda.is_available():
        pytest.fail("GPU test run without CUDA")
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    deterministic = not atomics
    graphed = tiny_graphed_dino("cuda", deterministic=deterministic, log_interval=len(data),
                                **model)
    eager = tiny_graphed_dino("cuda", deterministic=deterministic, log_interval=1,
                              warmup_steps=10 ** 6, **model)
    # A new hub, which becomes the current one that the graphed model logs to.
    MessageHub.get_instance(f"graphed_dino_replay_{uuid.uuid4().hex}")
    ours_wrapper, their_wrapper = (adamw_wrapper(m, amp=amp, lr=lr, fused=True)
                                   for m in (graphed, eager))
    theirs = []
    for i, batch in enumerate(data):
        copy_training_state(graphed, ours_wrapper.optimizer, eager, their_wrapper.optimizer)
        before = flat_parameters(graphed)
        draws = torch.cuda.get_rng_state()
        theirs.append(eager.train_step(copy.deepcopy(batch), their_wrapper))
        torch.cuda.set_rng_state(draws)
        if i in quiet_steps:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            last = graphed.train_step(copy.deepcopy(batch), ours_wrapper)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        ours_update, their_update = (flat_parameters(m) - before for m in (graphed, eager))
        if after_step is not None:
            after_step(graphed, i)
        # Adam's update is about lr * sign(m) per element, so one element whose
        # gradient rounds to the other sign moves the norm by 2 / sqrt(8e6).
        assert (ours_update - their_update).norm() <= 1e-2 * their_update.norm(), i
        assert not strays(graphed, ours_update, their_update, lr), i
        # The BN layers train: a replay must move their running statistics too.
        for (name, mine), other in zip(graphed.named_buffers(), eager.buffers(), strict=True):
            torch.testing.assert_close(mine, other, rtol=1e-4, atol=1e-6,
                                       msg=lambda text, at=f"step {i}, {name}": f"{at}: {text}")
        # Each parameter's (clipped) gradient, which Adam's update hides where
        # it is small; with two keys .grad holds the later capture's tensors.
        if len(graphed.captured_keys) <= 1:
            for (name, mine), other in zip(graphed.named_parameters(), eager.parameters(),
                                           strict=True):
                assert (mine.grad is None) == (other.grad is None), (i, name)
                if mine.grad is not None:
                    error = (mine.grad - other.grad).norm() / other.grad.norm().clamp_min(1e-12)
                    assert error <= 10 * rtol, (i, name, error.item())
    assert set(last) == set(theirs[-1]) and {"loss", "grad_norm", "dn_loss_cls"} <= set(last)
    recorded = graphed_detector.StepLogs.recorded(last, len(data))
    for name in last:
        ours = [row[name] for row in recorded]
        assert ours == pytest.approx([step[name] for step in theirs], rel=rtol, abs=1e-6), name
    return graphed, eager


def strays(model, ours: torch.Tensor, theirs: torch.Tensor, lr: float) -> list:
    """The names of ``model``'s parameters whose flat update ``ours`` is not
    ``theirs``: most of their elements off by half or more.

    The norm check above cannot see a small tensor (a bias, the level
    embeddings) updated wrongly or not at all, which a replay could do; Adam's
    rare sign flips (an element off by twice) leave most elements close."""
    sizes = [p.numel() for p in model.parameters()]
    names = [name for name, _ in model.named_parameters()]
    return [name for name, mine, other in zip(names, ours.split(sizes), theirs.split(sizes))
            if ((mine - other).abs() > 0.5 * other.abs() + 1e-3 * lr).float().mean() > 0.5]

