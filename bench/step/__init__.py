"""Whole-model measurements behind tools/profile_step.py and
tools/compare_runs.py: profiler summaries of training steps (profiling),
where a step waits for the device (syncs), training runs read back from
their work_dirs (runs) and loss-curve plots (plot, also for tools/parity.py
train); for graphed configs, the pixels their canvases add (canvas_padding)
and what each shape key compiles (compile_keys)."""
