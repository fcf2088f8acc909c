# dino_bf16_fast_host.py with the transformer's layers compiled by
# torch.compile (msda_mm's CompileSubmodulesHook, opt-in): the host-bound
# batch-8 step launches ~7500 kernels (64 ms of host time on the H200 box),
# most of them small ones in the encoder and decoder layers (norms, residual
# adds, FFN, sampling-location arithmetic), which compiling fuses.  The first
# steps compile (minutes); the decoder's query count changes with the
# number of boxes (denoising queries), which torch.compile handles with
# dynamic shapes after its first recompile.  On the H200 (800 x 1333, batch
# 8): 291.6 ms a step with 97.5 ms of GPU time, against 321.5 / 156.3 ms
# uncompiled, though launches fell only 7521 -> 7161 a step: the gain is
# in the fused kernels' memory traffic and the host's eager ops
# (docs/training.md).
_base_ = './dino_bf16_fast_host.py'

custom_hooks = [
    dict(type='CompileSubmodulesHook', modules=['encoder.layers', 'decoder.layers'])
]
