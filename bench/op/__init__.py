"""The MSDA benchmark behind tools/benchmark.py: presets and inputs
(presets, inputs), implementations (impls; peers for the optional peer
packages deformops and msda_triton), timers (timing), one cell (cell), the matrix (run) and its
reports (report, targets, plot); shared command-line pieces (cli), also
used by the research/ tools."""
