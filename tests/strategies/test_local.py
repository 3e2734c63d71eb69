"""``local`` with a graph model: GCN trained full graph through ``jimu train``'s path, resumed exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from deepjimu.config import RunConfig
from deepjimu.launch import train
from deepjimu.record.read import read_events
from deepjimu.report import report

# a small SBM whose node features alone say the class poorly (see tests/data/test_graph.py)
SBM: dict[str, Any] = {
    "dataset": "sbm",
    "synthetic_n": 600,
    "synthetic_features": 30,
    "synthetic_classes": 3,
    "sbm_degree": 8.0,
    "sbm_homophily": 0.9,
    "quiet": True,
    "strategy": "local",
}
GCN = {"model": "gcn", "lr": 0.01, "weight_decay": 5e-4, "batch_size": 10_000}


def _train(tmp_path: Path, name: str, **kw: Any) -> dict[str, Any]:
    summary = train(RunConfig(runs_dir=str(tmp_path), name=name, **{**SBM, **kw}))
    assert summary is not None
    return summary


def test_gcn_trains_full_graph_and_resumes_exactly(tmp_path: Path) -> None:
    full = _train(tmp_path, "full", epochs=20, **GCN)
    assert full["epochs"] == 20 and full["steps"] == 20  # one full-graph step per epoch
    events = read_events(tmp_path / "full")
    assert len(events) == 20 and all(e["samples_per_s"] for e in events)
    # the summary scores the final model on the graph as the last event did
    assert full["test_acc"] == events[-1]["test_acc"] and full["val_acc"] == events[-1]["val_acc"]
    assert full["test_acc_at_best_val"] is not None and full["data_info"]["graph_nodes"] == 600
    # the graph is what helps: an MLP on the same nodes' own features does much worse
    mlp = _train(tmp_path, "mlp", epochs=20, model="mlp:16x1", graph_hops=0, lr=0.01)
    assert full["test_acc_at_best_val"] > mlp["test_acc_at_best_val"] + 0.15, (full, mlp)
    # stopped at 10 epochs and resumed to 20: the same events, weights and result
    _train(tmp_path, "part", epochs=10, checkpoint_every=5, **GCN)
    resumed = _train(tmp_path, "part", epochs=20, resume=str(tmp_path / "part"), **GCN)
    strip = (
        "time_s",
        "fit_s",
        "samples_per_s",
        "train_s",
        "eval_s",
        "resumed",
        "compute_s",
        "compute_s_per_rank",
        "peak_mem_mb_per_rank",
    )
    again = [{k: v for k, v in e.items() if k not in strip} for e in read_events(tmp_path / "part")]
    assert again == [{k: v for k, v in e.items() if k not in strip} for e in events]
    assert resumed["test_acc"] == full["test_acc"]
    report(tmp_path / "part", plots=False)
    assert json.loads((tmp_path / "part" / "config.json").read_text())["model"] == "gcn"


def test_admm_trains_on_graph_rows(tmp_path: Path) -> None:
    """Graph data sets are feature rows to the other strategies: admm needs no graph code."""
    s = _train(tmp_path, "admm", strategy="admm", workers=1, model="mlp:32x1", epochs=10)
    assert s["test_acc_at_best_val"] > 0.8, s
