"""msda_mm.parity.training's state copies and step check on CPU: a copied
state steps as its source does; a step checked against itself is at
distance 0; one that updates or moves the BN statistics otherwise stands at
distance ~1, and its own result is kept."""
import pytest
import torch

from msda_mm.parity.training import (
    check_step,
    copy_training_state,
    flat_parameters,
    flat_tensors,
    load_training_state,
    state_names,
    training_state,
)


def toy():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4),
                                torch.nn.Dropout(0.5))
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def make_step(model, optimizer, data, lr_scale=1.0, bn=True):
    def step():
        optimizer.zero_grad()
        model[1].momentum = 0.1 if bn else 0.0
        loss = model(data).square().sum()  # the dropout draws from the generator
        loss.backward()
        for group in optimizer.param_groups:
            group["lr"] = 0.1 * lr_scale
        optimizer.step()
        model[1].momentum = 0.1
        return loss.detach()
    return step


def test_a_step_checked_against_itself_is_at_zero():
    model, optimizer = toy()
    data = torch.randn(8, 4)
    make_step(model, optimizer, data)()  # the optimizer's state exists
    step = make_step(model, optimizer, data)
    _, check = check_step(model, optimizer, step, step, torch.default_generator)
    assert check == dict(update=0.0, update_floor=0.0, buffers=0.0, buffers_floor=0.0,
                         update_along=0.0, update_along_floor=0.0)


@pytest.mark.parametrize("lr_scale, along", [(2.0, 1.0), (0.5, -0.5)])
def test_a_longer_or_shorter_update_shows_its_sign(lr_scale, along):
    """An update at twice (half) the eager one's learning rate goes about
    once (half) its length further (shorter) along it, and the second
    eager run, the same step, 0 (AdamW's decoupled decay scales with the
    rate too, so the whole update does)."""
    model, optimizer = toy()
    data = torch.randn(8, 4)
    make_step(model, optimizer, data)()
    _, check = check_step(model, optimizer, make_step(model, optimizer, data, lr_scale),
                          make_step(model, optimizer, data), torch.default_generator)
    assert check["update_along"] == pytest.approx(along, rel=0.05)
    assert check["update_along_floor"] == 0.0


@pytest.mark.parametrize("lr_scale, bn, moved", [(2.0, True, "update"), (1.0, False, "buffers")])
def test_a_step_that_differs_stands_off_and_its_result_is_kept(lr_scale, bn, moved):
    model, optimizer = toy()
    data = torch.randn(8, 4)
    make_step(model, optimizer, data)()
    result, check = check_step(model, optimizer, make_step(model, optimizer, data, lr_scale, bn),
                               make_step(model, optimizer, data), torch.default_generator)
    draws = torch.default_generator.get_state()
    assert check[moved] == pytest.approx(1.0, rel=0.05)
    assert check["update_floor"] == 0.0 and check["buffers_floor"] == 0.0
    assert check["buffers" if moved == "update" else "update"] == 0.0
    # Left where the checked step left it, the generator too: as the same
    # toy from the same start stepped twice without a check.
    twin, twin_optimizer = toy()
    torch.randn(8, 4)  # the data's draws, as above
    make_step(twin, twin_optimizer, data)()
    twin_result = make_step(twin, twin_optimizer, data, lr_scale, bn)()
    assert torch.equal(result, twin_result)
    assert torch.equal(flat_parameters(model), flat_parameters(twin))
    assert torch.equal(model[1].running_var, twin[1].running_var)
    assert torch.equal(draws, torch.default_generator.get_state())


def test_state_names_are_the_parameters_and_the_saved_float_buffers():
    model, _ = toy()
    model.register_buffer("workspace", torch.zeros(2), persistent=False)
    params, buffers = state_names(model)
    assert params == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert buffers == ["1.running_mean", "1.running_var"]


def test_a_kept_state_gives_the_tensors_named_in_flat_order():
    model, optimizer = toy()
    kept = training_state(model, optimizer)
    params, buffers = state_names(model)
    before = flat_parameters(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
        model[1].running_mean.add_(2.0)
    assert torch.equal(flat_tensors(model, kept, params), before)
    assert torch.equal(flat_tensors(model, None, params), before + 1.0)
    assert torch.equal(flat_tensors(model, None, buffers[:1]), torch.full((4,), 2.0))
    assert flat_tensors(model, None, []).numel() == 0
    load_training_state(model, optimizer, kept)
    assert torch.equal(flat_parameters(model), before)
    assert torch.equal(model[1].running_mean, torch.zeros(4))


def test_the_twin_starts_from_the_source_state_and_steps_as_it_does():
    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
              for _ in range(2)]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=0.1) for m in models]
    data = torch.randn(8, 4)

    def step(model, optimizer):
        optimizer.zero_grad()
        model(data).square().sum().backward()
        optimizer.step()

    for model, optimizer, steps in zip(models, optimizers, (2, 1)):  # apart in state
        for _ in range(steps):
            step(model, optimizer)
    copy_training_state(models[0], optimizers[0], models[1], optimizers[1])
    for model, optimizer in zip(models, optimizers):
        step(model, optimizer)
    assert torch.equal(flat_parameters(models[0]), flat_parameters(models[1]))
    assert torch.equal(models[0][1].running_mean, models[1][1].running_mean)


def test_a_source_without_optimizer_state_leaves_the_target_none():
    models = [torch.nn.Linear(2, 2) for _ in range(2)]
    optimizers = [torch.optim.AdamW(m.parameters()) for m in models]
    models[1](torch.ones(1, 2)).sum().backward()
    optimizers[1].step()
    copy_training_state(models[0], optimizers[0], models[1], optimizers[1])
    assert not optimizers[1].state


def test_loading_a_state_keeps_the_optimizers_tensors():
    """A captured graph reads and writes the optimizer's state tensors by
    address: loading a state copies into them, it does not swap them."""
    model, optimizer = toy()
    data = torch.randn(8, 4)
    make_step(model, optimizer, data)()
    kept = training_state(model, optimizer)
    tensors = [value for state in optimizer.state.values() for value in state.values()]
    make_step(model, optimizer, data)()
    load_training_state(model, optimizer, kept)
    assert [id(value) for state in optimizer.state.values() for value in state.values()] == [
        id(value) for value in tensors]
    for now, saved in zip(tensors, (v for state in kept.optimizer for v in state.values())):
        assert now is not saved and torch.equal(now, saved)
