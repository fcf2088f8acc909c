"""Counting what would wait on CUDA while CPU tests run."""
import torch
from torch.profiler import ProfilerActivity, profile

# Host-side ops that wait for the device on CUDA (on the CPU they run, but
# do not wait): scalar reads, nonzero, unique (its output size).
WAITING_OPS = ("aten::_local_scalar_dense", "aten::nonzero", "aten::_unique2", "aten::unique_dim")


def count_host_waits(fn, monkeypatch) -> int:
    """Device-to-host transfers (``Tensor.cpu``), blocking host-to-device
    copies (``Tensor.new_tensor`` of Python numbers, which on CUDA copy from
    pageable memory and wait), both free on CPU tensors and so counted by
    hand, plus the ops of WAITING_OPS while ``fn`` runs."""
    transfers = []

    def counting(name):
        method = getattr(torch.Tensor, name)

        def counted(self, *args, **kwargs):
            transfers.append(name)
            return method(self, *args, **kwargs)
        return counted

    for name in ("cpu", "new_tensor"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    monkeypatch.undo()
    return len(transfers) + sum(e.name in WAITING_OPS for e in prof.events())
