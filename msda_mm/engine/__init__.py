"""Training-loop pieces for mmengine; importing registers them in mmdet's registries."""
from .compile_submodules_hook import CompileSubmodulesHook, compile_submodules
from .fp32_modules import keep_fp32
from .merged_groups_constructor import MergedGroupsOptimWrapperConstructor
from .selective_amp_optim_wrapper import SelectiveAmpOptimWrapper

__all__ = ["CompileSubmodulesHook", "MergedGroupsOptimWrapperConstructor",
           "SelectiveAmpOptimWrapper", "compile_submodules", "keep_fp32"]
