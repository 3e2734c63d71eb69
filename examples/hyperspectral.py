"""Classify every pixel of a hyperspectral scene with admm and with Adam; draw the maps.

    python examples/hyperspectral.py                      # a generated scene (no files needed)
    python examples/hyperspectral.py --data-dir data      # Indian Pines from data/indian-pines/
    python examples/hyperspectral.py --data-dir data --dataset pavia-u --download

Each labelled pixel's spectrum is a sample (``jimu train --dataset indian-pines`` trains on
the same samples); 10% of each class trains (``--train-fraction``), the rest tests. The
same MLP is trained by pdADMM (``admm``, layer-parallel, gradient-free) and by backprop
with Adam (``local``) through ``deepjimu.fit``, the engine of ``jimu train``. Then every
pixel of the scene, labelled or not, is classified, and the ground truth and both maps are
drawn side by side into a PNG (``--out``). It prints one JSON line: each strategy's test
accuracy and the PNG's path.

Without ``--data-dir`` the scene is generated here, and says so: 64 x 64 pixels of 48
bands in 6 classes of fields (each class a smooth spectrum, each pixel noisy around it),
written as the Indian Pines files into a temporary folder, so it goes through the very
loader the real files do. The real scenes are not downloadable from this project's test
machines: the figures of a generated scene say the code runs, not how well it classifies
Indian Pines.
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # a file, no window
import matplotlib.pyplot as plt
import numpy as np
import scipy.io
import torch

from deepjimu import fit
from deepjimu.data import DataOptions
from deepjimu.data.hyperspectral import SCENES, PixelScene, pixel_scene
from deepjimu.models import build_model


def generated_scene(folder: Path, seed: int = 0, side: int = 64, bands: int = 48) -> Path:
    """Write a made-up scene as ``folder / indian-pines / *.mat``; returns ``folder``.

    Fields: each pixel belongs to the nearest of 24 random centres, each centre of one of
    6 classes; pixels near a field's edge, and a random fifth of the rest, carry no label,
    as in the real ground truths.
    """
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0, side, (24, 2))
    field_class = np.concatenate([np.arange(1, 7), rng.integers(1, 7, 18)])
    rows, cols = np.mgrid[0:side, 0:side]
    dist = np.hypot(rows[..., None] - centres[:, 0], cols[..., None] - centres[:, 1])
    nearest = np.sort(dist, axis=-1)
    field = dist.argmin(-1)
    classes = field_class[field]
    wavelength = np.linspace(0, 1, bands)
    peaks = rng.uniform(0, 1, (7, 3))
    spectra = np.stack(
        [sum(np.exp(-(((wavelength - p) / 0.15) ** 2)) for p in peaks[c]) for c in range(7)]
    )
    brightness = rng.uniform(0.6, 1.4, len(centres))[field]  # fields of one class differ
    cube = spectra[classes] * brightness[..., None] + rng.normal(0, 0.6, (side, side, bands))
    gt = classes.astype(np.uint8)
    gt[(nearest[..., 1] - nearest[..., 0] < 1.5) | (rng.random((side, side)) < 0.2)] = 0
    scene = SCENES["indian-pines"]
    out = folder / "indian-pines"
    out.mkdir(parents=True, exist_ok=True)
    scaled = np.clip(1000 + 2000 * cube, 0, 65535).astype(np.uint16)  # the files' uint16 counts
    scipy.io.savemat(out / scene.cube_file, {scene.cube_key: scaled})
    scipy.io.savemat(out / scene.gt_file, {scene.gt_key: gt})
    return folder


def train(strategy: str, s: PixelScene, classes: int, args: argparse.Namespace) -> torch.nn.Module:
    """The MLP ``args.model`` trained by ``strategy`` on the scene's training pixels."""
    x, y = s.samples(s.train), s.labels(s.train)
    factory = functools.partial(build_model, args.model, (x.shape[1],), classes, args.seed)
    options = {"epochs": args.epochs, "seed": args.seed, "quiet": True}
    fitted = fit(strategy, factory, x, y, test=(s.samples(s.test), s.labels(s.test)), workers=1,
                 **options)  # fmt: skip
    print(f"{strategy}: test accuracy {fitted.summary['test_acc']:.4f}", flush=True)
    return fitted.model


def draw(s: PixelScene, maps: dict[str, np.ndarray], accs: dict[str, float], out: Path) -> None:
    """Ground truth and each strategy's map of every pixel, one colour per class."""
    colours = plt.get_cmap("tab20", 20)
    panels = {"ground truth (black: no label)": s.gt, **maps}
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 4.3))
    for ax, (title, m) in zip(axes, panels.items(), strict=True):
        rgb = colours(m % 20)[..., :3]
        if m is s.gt:
            rgb[m == 0] = 0
        ax.imshow(rgb, interpolation="nearest")
        ax.set_title(title if m is s.gt else f"{title}: test acc {accs[title]:.3f}", fontsize=10)
        ax.axis("off")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="folder with <dataset>/*.mat (default: generate)")
    parser.add_argument("--dataset", default="indian-pines", choices=sorted(SCENES))
    parser.add_argument("--download", action="store_true", help="fetch missing files")
    parser.add_argument("--train-fraction", type=float, default=0.1)
    parser.add_argument("--model", default="mlp:256x2")
    parser.add_argument("--epochs", type=int, default=30, help="admm: iterations")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/hyperspectral-map.png")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        generated = args.data_dir is None
        if generated:
            args.dataset = "indian-pines"
            print("no --data-dir: a generated scene, not Indian Pines", flush=True)
        data_dir = generated_scene(Path(tmp), args.seed) if generated else Path(args.data_dir)
        opts = DataOptions(
            data_dir=data_dir,
            download=args.download,
            seed=args.seed,
            train_fraction=args.train_fraction,
        )
        s = pixel_scene(args.dataset, opts)
    classes = SCENES[args.dataset].num_classes
    every_pixel = torch.from_numpy(s.samples(np.arange(s.gt.size)))
    maps, accs = {}, {}
    for strategy, title in (("admm", "admm (pdADMM)"), ("local", "local (Adam)")):
        model = train(strategy, s, classes, args).eval()
        with torch.no_grad():
            pred = model(every_pixel).argmax(1).numpy()
        maps[title] = pred.reshape(s.gt.shape) + 1  # class numbers as the ground truth's
        accs[title] = float((pred[s.test] == s.labels(s.test)).mean())
    draw(s, maps, accs, Path(args.out))
    result = {"scene": "generated" if generated else args.dataset, "png": args.out}
    result |= {"admm_test_acc": accs["admm (pdADMM)"], "adam_test_acc": accs["local (Adam)"]}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
