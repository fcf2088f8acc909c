"""The lab beside the msda_mm package, not installed: the op benchmark behind
tools/benchmark.py (op) and the whole-model profiling, training-run
comparison and plots behind tools/profile_step.py and tools/compare_runs.py
(step).  Imported from a checkout; msda_mm never imports it."""
