"""The Hungarian matching benchmark: DINO-like cost matrices (costs) and the
GPU linear assignment beside scipy (linear_assignment, a script)."""
