"""Training-loop pieces for mmengine; importing registers them in mmdet's registries."""
from .fp32_modules import keep_fp32
from .merged_groups_constructor import MergedGroupsOptimWrapperConstructor
from .selective_amp_optim_wrapper import SelectiveAmpOptimWrapper

__all__ = ["MergedGroupsOptimWrapperConstructor", "SelectiveAmpOptimWrapper", "keep_fp32"]
