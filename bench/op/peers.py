"""Optional peer packages whose multi-scale deformable attention the
benchmark times beside msda_mm, and why one cannot run here.

A peer is optional: where it does not import, its rows are n/a with its
install line, and the other implementations run.  Every peer is called the
same way, positionally in mmcv's argument order and layouts
(:data:`MMCV_CALL`); each :class:`Peer` says which function of which module
that is.  Which function a peer's rows call is decided here alone, in
:data:`PEERS`; where an installed version has moved it, this table is the
one place to adapt.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Optional

import torch

# The arguments and result of the call every peer's rows make.
MMCV_CALL = ("(value (B, S, M, D), spatial_shapes (L, 2), level_start_index (L,), "
             "sampling_locations (B, Q, M, L, K, 2), attention_weights (B, Q, M, L, K)) "
             "-> (B, Q, M * D)")

MSDAFunction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                        torch.Tensor]


@dataclass(frozen=True)
class Peer:
    """An optional package's MSDA op as the benchmark calls it."""

    impl: str  # the --impl name of its rows
    module: str  # what it imports as
    function: str  # the attribute of ``module`` the rows call as MMCV_CALL says
    install: str  # the line its n/a rows give
    kernel: str  # which kernel its rows time, for the JSON's method notes
    cuda_only: bool = False  # it refuses tensors on any other device

    @property
    def expected_call(self) -> str:
        return f"{self.module}.{self.function}{MMCV_CALL}"


PEERS = {peer.impl: peer for peer in (
    # deformops 3's public op (the wheel of 3.0.1 read for its name): its
    # registry's ``msda``, which picks the backend per call.
    Peer(impl="deformops", module="deformops.registry", function="msda",
         install="pip install deformops",
         kernel="on the backend deformops picks for the call (Triton on CUDA, then its CUDA "
                "library; eager on CPU), fp32 accumulation for 16-bit training before SM 9.0"),
    # The Triton op msda_mm started from; its fp32_grad_accum left to its
    # automatic choice.
    Peer(impl="msda_triton", module="msda_triton", function="multi_scale_deformable_attention",
         install="pip install git+https://github.com/roulbac/msda-triton",
         kernel="on its Triton kernels, grad_value accumulated as it chooses (in fp32 for a "
                "bf16 value before SM 9.0)",
         cuda_only=True),
)}


def peer_unavailable(peer: Peer, device: torch.device) -> Optional[str]:
    """Why ``peer`` cannot run on ``device`` (it does not import: naming it
    and its install line; or it is CUDA only), or None."""
    try:
        importlib.import_module(peer.module)
    except ModuleNotFoundError as error:
        package = peer.module.partition(".")[0]
        if error.name in (peer.module, package):
            return f"{package} is not installed: {peer.install}"
        return f"{peer.module} does not import ({error}): {peer.install}"
    except (ImportError, OSError) as error:  # a build for another torch, a missing library
        return f"{peer.module} does not import ({type(error).__name__}: {error}): {peer.install}"
    if peer.cuda_only and device.type != "cuda":
        return f"{peer.impl}'s op is CUDA only"
    return None


def peer_function(peer: Peer) -> MSDAFunction:
    """``peer``'s MSDA function, to be called as ``peer.expected_call`` says.

    Raises AttributeError naming the expected call where the installed
    package has no such function.
    """
    module = importlib.import_module(peer.module)
    try:
        return getattr(module, peer.function)
    except AttributeError:
        version = getattr(module, "__version__", "of unknown version")
        raise AttributeError(
            f"{peer.module} {version} has no {peer.function}: the benchmark calls "
            f"{peer.expected_call}; adapt bench/op/peers.py") from None
