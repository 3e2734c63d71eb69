"""The options every run has: what runs where (the run group), and the data (the data group).

No torch import here: ``--help`` is built before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from deepjimu.applies import Applies, Takers
from deepjimu.budget import limit_problems
from deepjimu.choices import Device, Family, GraphFeatures, OmpWait, Precision, Split
from deepjimu.emulate import speeds_problems
from deepjimu.options.base import Group, checker, choice_problems, minimums, option

__all__ = ["DataGroup", "RunGroup"]

_GRAPH = Applies(data=(Family.GRAPH,))
_PLANETOID = Applies(data=("cora", "citeseer", "pubmed"))
_SYNTHETIC = Applies(data=("synthetic", "sbm", "bow", "synthetic-text"))
_SYNTHETIC_CLASSES = Applies(data=("synthetic", "sbm", "bow"))
_SBM = Applies(data=("sbm",))
_TEXT = Applies(data=(Family.TEXT,))
# token ids are not features: no class subset, no standardising
_NOT_TEXT = Applies(data=(Family.IMAGES, Family.TABULAR, Family.GRAPH, Family.TENSORS))
# the data sets whose files --download fetches (digits comes with scikit-learn,
# landsat-spectra with spyndex)
_FETCHED = Applies(
    data=(
        "mnist",
        "fashion-mnist",
        "kmnist",
        "cifar10",
        "cora",
        "citeseer",
        "pubmed",
        "shakespeare-char",
        "eurosat",
        "eurosat-ms",
        "indian-pines",
        "pavia-u",
    )
)
# remote sensing (issue 33): data sets split per class by a training share
_SCENES = ("indian-pines", "pavia-u")
_PER_CLASS = Applies(data=("eurosat", "eurosat-ms", *_SCENES, "landsat-spectra"))


@dataclass(frozen=True)
class RunGroup(Group):
    """What runs where: the strategy, workers, model, epochs, seed, device, threads, the run
    folder, checkpoints, evaluations, restarts and the split of work over workers.

    ``None`` means "the strategy's default" for ``workers``, ``epochs``;
    :func:`deepjimu.validation.validate` fills them in (and only then checks
    ``--emulate-speeds`` against the workers).
    """

    table: ClassVar[str] = "run"
    title: ClassVar[str] = "run"
    universal: ClassVar[bool] = True

    strategy: str = option("admm", "training strategy")
    workers: int | None = option(None, "number of worker processes")
    replicas: int = option(
        1,
        "data-parallel replicas of a split model: --workers W = R x stages, each replica "
        "trains on 1/R of every batch (admm: of the samples) and its stages are averaged "
        "over the replicas",
        applies=Applies(strategies=Takers(trait=lambda t: t.replicates)),
    )
    model: str = option(
        "mlp:256x3",
        "model spec: mlp:WIDTHxDEPTH or mlp:W1-W2-..., cnn:C1-C2-... or cnn:CxDEPTH, lenet, "
        "resnet or resnet:BLOCKS, gcn or gcn:HIDDEN (graph data, strategy local), "
        "embed:VOCAB:DIM[:WIDTHxDEPTH or :W1-W2-...] (bags of token ids)",
    )
    dropout: float = option(
        0.0,
        "dropout probability in a gpt model's blocks (nanoGPT: 0 at its small sizes, 0.2 at 6x384)",
        applies=_TEXT,
    )
    epochs: int | None = option(None, "passes over the training data (admm: iterations)")
    name: str | None = option(
        None, "run folder name under --runs-dir", default_text="strategy-dataset-time"
    )
    runs_dir: str = option("runs", "folder that holds run folders")
    seed: int = option(0, "one seed for data split, init, shuffling")
    device: Device = option(Device.AUTO, "auto, cpu or cuda")
    quiet: bool = option(False, "no progress bar")
    threads: int = option(
        0,
        "CPU threads per worker (0: OMP_NUM_THREADS if set, else cores / workers on this machine)",
    )
    omp_wait: OmpWait = option(
        OmpWait.AUTO,
        "OpenMP idle threads: auto (passive when workers x threads exceed the cores, else "
        "OpenMP's default; OMP_WAIT_POLICY wins if set), default, active or passive",
    )
    precision: Precision = option(
        Precision.FP32, "matmul precision: fp32, tf32 (CUDA tensor cores) or bf16 (autocast)"
    )
    checkpoint_every: int = option(0, "save a checkpoint every K epochs (0: only at the end)")
    resume: str | None = option(None, "run folder to resume from")
    eval_every: int = option(1, "evaluate and log every K epochs")
    max_restarts: int = option(
        0,
        "after a worker fails, restart all workers up to N times from the latest checkpoint "
        "(under torchrun: give torchrun's own --max-restarts)",
    )
    balance: str = option(
        "auto",
        "work per worker: auto (speed when the fastest worker measures more than 1.1x the "
        "slowest, else even), even (the strategy's own split: stages by time, admm by its cost "
        "estimate, ddp equal shards), speed (that split weighted by each worker's measured "
        "speed); stages also: time, size or N,N,...",
        commas=True,
        applies=Applies(strategies=Takers(trait=lambda t: t.balances)),
    )
    emulate_speeds: str = option(
        "",
        "one factor in (0, 1] per worker, e.g. 1,0.3: each worker runs in a CPU cgroup with "
        "that share of its threads' CPU time (root; a rehearsal of a mixed cluster)",
        commas=True,
    )

    memory_limit: str = option(
        "",
        "memory budget of each worker, e.g. 1.5G or 512M (K, M, G: powers of 1024): on a CPU "
        "each worker runs in a memory cgroup of that size (root), on a GPU its CUDA allocator "
        "is capped; a worker that passes it ends the run in one line",
    )

    def problems(self) -> list[str]:
        problems = minimums(
            self,
            {"workers": 1, "epochs": 1, "checkpoint_every": 0, "threads": 0, "max_restarts": 0,
             "eval_every": 1, "replicas": 1},
        )  # fmt: skip
        if self.name is not None and (
            self.name in ("", ".", "..") or "/" in self.name or "\\" in self.name
        ):
            problems.append(f"name must be a plain folder name (name: {self.name!r})")
        if self.workers is not None:
            problems += speeds_problems(self.emulate_speeds, self.workers)
            if self.replicas >= 1 and self.workers % self.replicas:
                problems.append(
                    f"workers must be a multiple of replicas (workers: {self.workers}, "
                    f"replicas: {self.replicas})"
                )
        if not 0 <= self.dropout < 1:
            problems.append(f"dropout must be in [0, 1) (dropout: {self.dropout})")
        problems += limit_problems(self.memory_limit)
        return [*problems, *choice_problems(self, RunGroup)]


@dataclass(frozen=True)
class DataGroup(Group):
    """The data set, its split and preparation; synthetic, graph and remote-sensing data."""

    table: ClassVar[str] = "data"
    title: ClassVar[str] = "data"
    universal: ClassVar[bool] = True

    dataset: str = option("digits", "dataset name")
    data_dir: str = option("data", "folder with dataset files")
    download: bool = option(
        False, "fetch missing dataset files (checksums verified)", applies=_FETCHED
    )
    data_url: str | None = option(None, "base URL of a mirror for --download", applies=_FETCHED)
    val_fraction: float = option(
        0.1,
        "fraction of the training set held out for validation",
        # Planetoid's public and random splits have their own validation nodes
        applies=Applies(data=(Family.IMAGES, Family.TABULAR, Family.TENSORS, "sbm")),
    )
    downsample: int = option(
        1,
        "average-pool images by this factor per side (2: 28x28 -> 14x14)",
        applies=Applies(data=(Family.IMAGES, Family.TENSORS)),
    )
    classes: list[int] | None = option(None, "keep only these classes, e.g. 0,1", applies=_NOT_TEXT)
    normalize: bool = option(
        False, "standardise features with the training mean and std", applies=_NOT_TEXT
    )
    block_size: int = option(
        64, "tokens (characters) a sample: the language model's context", applies=_TEXT
    )
    synthetic_n: int = option(10000, "number of samples (train + test)", applies=_SYNTHETIC)
    synthetic_features: int = option(
        196, "number of input features (bow, synthetic-text: the vocabulary)", applies=_SYNTHETIC
    )
    synthetic_classes: int = option(10, "number of classes", applies=_SYNTHETIC_CLASSES)
    train_fraction: float | None = option(
        None,
        "share of each class's samples that trains, the rest tests",
        default_text="the data set's: indian-pines, pavia-u 0.1; eurosat, eurosat-ms 0.8; "
        "landsat-spectra 0.5",
        applies=_PER_CLASS,
    )
    patch: int = option(
        0,
        "0: each pixel's spectrum as a vector (MLPs); K (odd): the K x K window around it "
        "as bands x K x K (CNNs)",
        applies=Applies(data=_SCENES),
    )
    split: Split = option(
        Split.PUBLIC,
        "Planetoid's public split (20 per class / 500 / 1,000) or random (same sizes, by --seed)",
        applies=_PLANETOID,
    )
    graph_hops: int = option(2, "propagation steps K (features A_hat^k X, k <= K)", applies=_GRAPH)
    graph_features: GraphFeatures = option(
        GraphFeatures.LAST,
        "last (A_hat^K X, as SGC) or concat ([X, A_hat X, ..., A_hat^K X], as pdADMM-G)",
        applies=_GRAPH,
    )
    graph_row_norm: bool = option(True, "scale each node's features to sum 1 first", applies=_GRAPH)
    sbm_degree: float = option(10.0, "average node degree (nodes: --synthetic-n)", applies=_SBM)
    sbm_homophily: float = option(0.8, "fraction of edges inside a class", applies=_SBM)

    def problems(self) -> list[str]:
        problems, need = checker()
        need(
            0 <= self.val_fraction < 1,
            f"val-fraction must be in [0, 1) (val-fraction: {self.val_fraction})",
        )
        problems += minimums(self, {"downsample": 1})
        need(
            self.train_fraction is None or 0 < self.train_fraction < 1,
            f"train-fraction must be in (0, 1) (train-fraction: {self.train_fraction})",
        )
        need(
            self.patch == 0 or (self.patch > 0 and self.patch % 2 == 1),
            f"patch must be 0 or an odd window size (patch: {self.patch})",
        )
        problems += minimums(
            self, {"synthetic_n": 10, "synthetic_features": 1, "synthetic_classes": 2}
        )
        if self.classes is not None:
            need(
                len(self.classes) >= 2,
                f"classes must name at least 2 classes (classes: {self.classes})",
            )
            need(
                len(set(self.classes)) == len(self.classes),
                f"classes must not repeat (classes: {self.classes})",
            )
        return [*problems, *self._graph_problems(), *choice_problems(self, DataGroup)]

    def _graph_problems(self) -> list[str]:
        """The graph options (issue 10): hops, and the synthetic SBM graph's degree and homophily."""
        problems, need = checker()
        problems += minimums(self, {"graph_hops": 0})
        need(
            0 < self.sbm_degree < self.synthetic_n - 1,
            f"sbm-degree must be > 0 and below synthetic-n - 1 (sbm-degree: {self.sbm_degree}, "
            f"synthetic-n: {self.synthetic_n})",
        )
        need(
            0 <= self.sbm_homophily <= 1,
            f"sbm-homophily must be in [0, 1] (sbm-homophily: {self.sbm_homophily})",
        )
        return problems
