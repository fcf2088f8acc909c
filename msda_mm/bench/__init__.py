"""The MSDA benchmark behind tools/benchmark.py: presets and inputs
(presets, inputs), implementations (impls), timers (timing), one cell
(cell), the matrix (run) and its reports (report, targets, plot); the
gather ceiling behind tools/gather_ceiling.py (gather); shared
command-line pieces (cli)."""
