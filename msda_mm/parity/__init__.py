"""Whole-model tooling behind tools/parity.py and tools/profile_step.py:
switching a model's MSDA op (attention), training steps outside mmengine's
loop (training), comparisons (compare), profiler summaries (profiling),
loss-curve plots (plot), the bf16-against-fp32 kernel check on a model's own
op calls (kernel_check) and shared command-line pieces (cli)."""
