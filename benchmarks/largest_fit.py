"""The widest mlp:Wx8 each strategy fits on one 80 GB GPU, at 1 and 8 workers, on paper.

From the memory model alone (``strategies.registry.rank_peaks``, the figures ``jimu plan``
ranks by; nothing is allocated): MNIST-sized inputs, batch 64, Adam, fp32, the device's
memory as ``examples/clusters/h100-node.toml`` gives it (``memory_gb = 80``)::

    python benchmarks/largest_fit.py
"""

from __future__ import annotations

import itertools

from deepjimu.config import RunConfig
from deepjimu.cost.profile import Layer
from deepjimu.strategies.registry import entry, rank_peaks, strategy_names

DEVICE_BYTES = 80e9  # examples/clusters/h100-node.toml: memory_gb = 80 (1e9 bytes)


def layers(width: int, depth: int = 8, n_in: int = 784, classes: int = 10) -> list[Layer]:
    dims = [n_in] + [width] * depth + [classes]
    pairs = enumerate(itertools.pairwise(dims))
    return [Layer(f"{i}", 2.0 * a * b, a * b + b, a, b) for i, (a, b) in pairs]


def widest(strategy: str, workers: int) -> int:
    """The widest multiple of 64 whose largest rank fits the device."""
    lo, hi = 64, 1 << 20
    while hi - lo > 64:
        mid = (lo + hi) // 2 // 64 * 64
        cfg = RunConfig(strategy=strategy, workers=workers, model=f"mlp:{mid}x8", batch_size=64)
        peak = max(rank_peaks(cfg, layers(mid), 60000, 0, cuda=True))
        lo, hi = (mid, hi) if peak <= DEVICE_BYTES else (lo, mid)
    return lo


def main() -> None:
    print(f"{'strategy':>15} {'GPUs':>5} {'widest':>14} {'parameters':>11}")
    for name in strategy_names():
        traits = entry(name).traits
        for workers in (1, 8):
            if workers < traits.min_workers or (traits.max_workers or workers) < workers:
                continue
            w = widest(name, workers)
            params = sum(layer.params for layer in layers(w))
            print(f"{name:>15} {workers:>5} {'mlp:' + str(w) + 'x8':>14} {params / 1e9:>10.2f}B")


if __name__ == "__main__":
    main()
