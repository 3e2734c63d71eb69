"""pdADMM's math: every update a pure function of tensors (updates: dense layers; conv and cg: conv layers; quantize: the exchange's integer codes; wire: their bytes).

Imports nothing else of deepjimu (tests/test_structure.py checks it): the strategy
(deepjimu.strategies.admm) and the Python API (deepjimu.api) drive these functions and
move their tensors.
"""
