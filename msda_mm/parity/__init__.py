"""Parity of msda_mm's op with mmcv's inside a whole model, behind
tools/parity.py: switching a model's MSDA op (attention), training steps
outside mmengine's loop (training), comparisons (compare), gradients of one
batch with and without fp32 compute (gradients), the bf16-against-fp32 kernel
check on a model's own op calls (kernel_check) and the JSON reports with the
environment they ran in (report)."""
