"""StopLoaderWorkersHook: a loader's persistent workers stopped as the run
ends, so that no exit handler waits on a worker still running; the loader
stays usable, and loops the run never built are left alone."""
from types import SimpleNamespace

from mmdet.registry import HOOKS
from mmengine.registry import DefaultScope
from mmengine.runner import BaseLoop
from torch.utils.data import DataLoader

from msda_mm.engine import StopLoaderWorkersHook, stop_loader_workers


class Loop(BaseLoop):
    def run(self) -> None:
        for _ in self.dataloader:
            pass


def persistent_loader() -> DataLoader:
    return DataLoader(list(range(8)), batch_size=2, num_workers=2, persistent_workers=True)


def test_stops_the_running_workers_and_the_loader_goes_on():
    loader = persistent_loader()
    assert [int(x) for batch in loader for x in batch] == list(range(8))
    workers = list(loader._iterator._workers)
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    assert stop_loader_workers(loader) is True
    # torch 2.11's exit handler joins each worker: a stopped one returns at once.
    assert not any(w.is_alive() for w in workers)
    assert [int(x) for batch in loader for x in batch] == list(range(8))
    assert stop_loader_workers(loader) is True


def test_a_loader_without_running_workers_has_nothing_to_stop():
    assert stop_loader_workers(persistent_loader()) is False  # never iterated
    in_process = DataLoader(list(range(4)), batch_size=2)
    list(in_process)
    assert stop_loader_workers(in_process) is False


def test_the_hook_stops_the_loops_the_run_built():
    runner = SimpleNamespace()
    train = Loop(runner, persistent_loader())
    train.run()
    workers = list(train.dataloader._iterator._workers)
    # The runner keeps a loop it never built as its config, or None.
    runner.__dict__.update(_train_loop=train, _val_loop=dict(type="ValLoop"), _test_loop=None)
    StopLoaderWorkersHook().after_run(runner)
    assert not any(w.is_alive() for w in workers)
    assert runner._val_loop == dict(type="ValLoop")
    StopLoaderWorkersHook().after_run(SimpleNamespace())  # a runner without these loops


def test_it_is_registered_for_configs():
    with DefaultScope.overwrite_default_scope("mmdet"):
        assert isinstance(HOOKS.build(dict(type="StopLoaderWorkersHook")), StopLoaderWorkersHook)
