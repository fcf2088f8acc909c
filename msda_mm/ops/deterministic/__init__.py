"""The deterministic backward's grad_value, without atomics.

msda_bwd_kernel without grad_value (grad_loc and grad_attn as in the
default backward, bitwise), then the samples sorted by cell (cells.py) and
a gather per value row (gather.py), no atomic on grad_value.  Rows
of 2 entries or more: a stable sort (sorted_fill.py), the terms
summed in float in sample order.  Sparser rows: a counting sort whose ranks
msda_bwd_kernel takes (bucket_fill.py), the terms summed as
integers: integer addition is associative, so the order of the samples no
longer matters.  Each row's terms c * go are scaled by 2**e, a power of two
the gather takes from a first pass over the row's entries (its largest
|c| * max_d |go|, a max), rounded to integers and summed in int64 registers
(fp32, fp64 values) or int32 (fp16, bf16: terms rounded in one FFMA), with
no sum past the register's range; each sum is scaled back by 2**-e and
rounded once (fixed_point.py, exact_sums.py); terms with an inf or NaN
factor are summed apart in float (nonfinite.py) in heads whose bound
(bound.py) says they hold any.

The host side: what msda_bwd_kernel fills for the sort (buffers.py), the
sort itself (buckets.py) and the gather's launch (grad_value.py);
backward/launcher.py runs them.
"""
