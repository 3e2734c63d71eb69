"""What a run's admm options come to before it iterates: the model kind's settings, whether mini-batches keep their auxiliary variables, and the combinations that cannot run."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence

from deepjimu.balance import balance_problems
from deepjimu.errors import JimuError
from deepjimu.models import build_model, parse_spec
from deepjimu.options import AdmmGroup, AdmmOptions
from deepjimu.run import Run
from deepjimu.strategies.admm.blocks import MLP_DEFAULTS, auto_defaults, has_conv
from deepjimu.strategies.admm.kept import kept_nbytes
from deepjimu.strategies.admm.layers import LayerOp
from deepjimu.strategies.admm.model import admm_layers
from deepjimu.strategies.admm.store import room
from deepjimu.units import format_bytes

__all__ = ["admm_settings", "auto_restarts", "keeps", "problems"]


def admm_settings(cfg: AdmmGroup, ops: Sequence[LayerOp], keep: bool) -> dict[str, float]:
    """ridge, momentum, sweeps and memory of a run: the options left to their default take
    the model kind's (``blocks.auto_defaults``); memory is 0 in full batch and for kept
    mini-batches, which need no statistics of other batches."""
    chosen = auto_defaults(ops, {k: getattr(cfg, f"admm_{k}") for k in MLP_DEFAULTS})
    if not cfg.admm_batch or keep:
        chosen["memory"] = 0.0
    return chosen


def problems(cfg: AdmmOptions, n_blocks: int) -> list[str]:
    """The problems of a run's admm options before it starts, one line each: a model admm does
    not train, and combinations of the mini-batch options, the readout, the balance and the
    precision that cannot run together."""
    kind = parse_spec(cfg.model).kind
    if kind not in ("mlp", "cnn", "factory"):  # a factory's: model_blocks checked it
        return [_refusal(cfg.model)]
    out = []
    if kind == "cnn" and cfg.admm_batch and cfg.admm_memory:  # asked for (default: none)
        # the statistics are those of dense layers on flat inputs (updates.WbStats)
        out.append(
            f"admm-memory works on MLPs only, not on conv layers yet "
            f"(admm-memory: {cfg.admm_memory:g}, model: {cfg.model})"
        )
    # the readouts that refit need every sample's targets z, which mini-batches that
    # restart (asked for, or auto's choice for CNNs and with --admm-memory: keeps) lack
    by_auto = auto_restarts(cfg, cnn=kind == "cnn")
    if cfg.admm_batch and cfg.admm_readout in ("last", "all"):
        needs = f"admm-readout {cfg.admm_readout} needs every sample's targets z, which "
        if cfg.admm_aux == "restart":
            out.append(
                needs + "restarted mini-batches (admm-aux restart) hold for one visit only; "
                "they use the iterate's weights"
            )
        elif by_auto:
            what = "conv layers" if kind == "cnn" else "admm-memory"
            out.append(
                needs + f"mini-batches with {what} restart at every visit (model: {cfg.model})"
            )
    if cfg.admm_batch and cfg.admm_aux == "keep":
        if kind == "cnn":  # the statistics are those of dense layers (updates.WbStats)
            out.append(
                f"admm-aux keep works on MLPs only, not on conv layers yet (model: {cfg.model})"
            )
        if cfg.admm_memory:
            out.append(
                f"admm-memory is for admm-aux restart: with keep every (W, b) step already "
                f"fits every sample (admm-memory: {cfg.admm_memory:g})"
            )
    assert cfg.workers is not None, "defaults not resolved"
    out += balance_problems(cfg.balance, n_blocks, cfg.workers)
    if kind == "cnn" and cfg.precision == "bf16":
        # under autocast the convolutions would return bfloat16 feature maps to exchange
        out.append(f"admm trains CNNs in fp32 or tf32 only (precision: bf16, model: {cfg.model})")
    return out


def keeps(
    cfg: AdmmOptions, ops: list[LayerOp], lo: int, hi: int, momentum: float, n: int, run: Run
) -> bool:
    """Collective: whether the mini-batches keep their auxiliary variables (``--admm-aux``).

    ``auto`` keeps them for MLPs without ``--admm-memory`` (faster and more accurate than
    restarting them: BENCHMARKS.md, section 5) where the disk holds them: the stores of
    all ranks (:func:`kept_nbytes`) must fit in the room (``store.room``) of the
    temporary folder of each, which is bounded by the available memory too where that
    folder is a tmpfs. Where they do not, ``auto`` restarts them, and ``keep`` ends in
    one line.
    """
    if not cfg.admm_batch or cfg.admm_aux == "restart":
        return False
    if auto_restarts(cfg, cnn=has_conv(ops)):
        return False
    where = tempfile.gettempdir()
    need = kept_nbytes(
        dict(enumerate(ops)), lo, hi, len(ops), momentum, n, cfg.admm_batch, bits=cfg.quantize
    )
    shares = run.gather_objects((need, *room(where)))
    total = sum(s[0] for s in shares)
    limit, how = min((s[1], s[2]) for s in shares)
    if total <= limit:
        return True
    text = (
        f"keeping the auxiliary variables of {n} samples needs about {format_bytes(total)} "
        f"under {where} ({how})"
    )
    if cfg.admm_aux == "keep":
        raise JimuError(
            f"admm-aux keep: {text}; set TMPDIR to a disk with room or use --admm-aux restart"
        )
    if cfg.admm_readout in ("last", "all"):  # the targets z of every sample are needed
        raise JimuError(
            f"admm-readout {cfg.admm_readout} needs kept mini-batches, and {text}; "
            "set TMPDIR to a disk with room"
        )
    if run.is_main and not cfg.quiet:
        print(f"admm: mini-batches restart their auxiliary variables: {text}")
    return False


def auto_restarts(cfg: AdmmGroup, cnn: bool) -> bool:
    """Whether ``--admm-aux auto`` restarts the mini-batches whatever the disk holds: for
    CNNs (the kept statistics are those of dense layers) and with ``--admm-memory``."""
    return cfg.admm_aux == "auto" and (cnn or cfg.admm_memory is not None)


def _refusal(spec: str) -> str:
    """The one line that says why admm cannot train a model that is neither mlp nor cnn."""
    if parse_spec(spec).kind == "gpt":
        return (
            f"admm solves each layer's subproblem in closed form (Linear and conv layers with "
            f"ReLU); model {spec}'s attention and layer norms are not such layers: train it "
            "with a gradient strategy (local, ddp, fsdp, tp, model-parallel, pipeline)"
        )
    if parse_spec(spec).kind != "gcn":  # name the first block it cannot train
        try:
            admm_layers(build_model(spec, (1, 32, 32), 10), (1, 32, 32))
        except JimuError as e:
            return f"{e} (model {spec}: admm trains mlp:... and cnn:... models)"
    return f"admm trains mlp:... and cnn:... models; model {spec!r} is not one"
