"""Training-loop pieces for mmengine; importing registers them in mmdet's
registries, and lets torch's weights-only loading read mmengine's checkpoints."""
from .captured_steps import CaptureError
from .checkpoint_allowlist import allow_mmengine_checkpoints
from .checkpoint_integrity import DamagedCheckpointError, checkpoint_problem
from .compile_submodules_hook import CompileSubmodulesHook, compile_submodules
from .fp32_modules import keep_fp32
from .graphed_data_parallel import GraphedDataParallel
from .merged_groups_constructor import MergedGroupsOptimWrapperConstructor
from .num_threads_hook import NumThreadsHook
from .selective_amp_optim_wrapper import SelectiveAmpOptimWrapper
from .stop_loader_workers_hook import StopLoaderWorkersHook, stop_loader_workers
from .verified_backend import VerifiedLocalBackend
from .verified_checkpoint_hook import VerifiedCheckpointHook

allow_mmengine_checkpoints()

__all__ = ["CaptureError", "CompileSubmodulesHook", "DamagedCheckpointError",
           "GraphedDataParallel", "MergedGroupsOptimWrapperConstructor",
           "NumThreadsHook", "SelectiveAmpOptimWrapper", "StopLoaderWorkersHook",
           "VerifiedCheckpointHook", "VerifiedLocalBackend", "checkpoint_problem",
           "compile_submodules", "keep_fp32", "stop_loader_workers"]
