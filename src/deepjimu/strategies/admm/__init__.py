"""pdADMM: gradient-free layer-parallel training (updates: math; blocks: per-worker state; driver: loops)."""
