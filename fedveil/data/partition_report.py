"""Describe how skewed a partition is: sizes, label histograms, distances to global.

Distances compare each client's label distribution p_k with the global one p:
``tv`` = 0.5 * sum|p_k - p| (total variation, in [0, 1]) and ``emd`` = sum|p_k - p|,
the label "earth mover's distance" of Zhao et al. 2018 (= 2 * TV; it is the EMD
under a 0/1 ground metric between classes). The report is JSON-serialisable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["format_partition_report", "partition_report"]


def partition_report(
    partitions: Sequence[np.ndarray], labels: np.ndarray, num_classes: int
) -> dict[str, Any]:
    """Per-client size and label histogram plus summary statistics."""
    y = np.asarray(labels).reshape(-1)
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, num_classes={num_classes})")
    glob = np.bincount(y, minlength=num_classes).astype(np.float64)
    glob_p = glob / max(glob.sum(), 1.0)

    clients: list[dict[str, Any]] = []
    seen = np.zeros(len(y), dtype=np.int64)
    for k, idx in enumerate(partitions):
        idx = np.asarray(idx, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= len(y)):
            raise ValueError(f"partition {k} has indices outside [0, {len(y)})")
        np.add.at(seen, idx, 1)
        hist = np.bincount(y[idx], minlength=num_classes)
        entry: dict[str, Any] = {
            "client": k,
            "size": int(idx.size),
            "label_counts": hist.tolist(),
            "num_classes": int(np.count_nonzero(hist)),
            "tv": None,  # undefined for an empty client
            "emd": None,
        }
        if idx.size:
            l1 = float(np.abs(hist / idx.size - glob_p).sum())
            entry["tv"], entry["emd"] = 0.5 * l1, l1
        clients.append(entry)

    sizes = np.array([c["size"] for c in clients], dtype=np.float64)
    tvs = np.array([c["tv"] for c in clients if c["tv"] is not None], dtype=np.float64)
    emds = 2.0 * tvs
    mean_size = float(sizes.mean()) if sizes.size else 0.0
    summary = {
        "size_min": int(sizes.min()) if sizes.size else 0,
        "size_median": float(np.median(sizes)) if sizes.size else 0.0,
        "size_max": int(sizes.max()) if sizes.size else 0,
        "size_mean": mean_size,
        "size_std": float(sizes.std()) if sizes.size else 0.0,
        "size_cv": float(sizes.std() / mean_size) if mean_size > 0 else 0.0,
        "empty_clients": int(np.sum(sizes == 0)),
        "classes_per_client_mean": (
            float(np.mean([c["num_classes"] for c in clients])) if clients else 0.0
        ),
        "tv_mean": float(tvs.mean()) if tvs.size else 0.0,
        "tv_max": float(tvs.max()) if tvs.size else 0.0,
        # size-weighted: how far the average *sample* sits from the global mix
        "tv_weighted": float(np.average(tvs, weights=sizes[sizes > 0])) if tvs.size else 0.0,
        "emd_mean": float(emds.mean()) if emds.size else 0.0,
        "emd_max": float(emds.max()) if emds.size else 0.0,
    }
    return {
        "num_clients": len(clients),
        "num_samples": len(y),
        "num_classes": num_classes,
        "assigned": int(np.count_nonzero(seen)),
        "unassigned": int(np.sum(seen == 0)),
        "duplicated": int(np.sum(seen > 1)),
        "global_label_counts": glob.astype(np.int64).tolist(),
        "summary": summary,
        "clients": clients,
    }


def format_partition_report(report: dict[str, Any], *, max_clients: int = 20) -> str:
    """Human-readable summary and per-client table (first ``max_clients`` rows)."""
    s = report["summary"]
    lines = [
        f"{report['num_clients']} clients, {report['num_samples']} samples, "
        f"{report['num_classes']} classes "
        f"(unassigned {report['unassigned']}, duplicated {report['duplicated']})",
        f"size: min {s['size_min']}  median {s['size_median']:g}  max {s['size_max']}  "
        f"mean {s['size_mean']:.1f}  cv {s['size_cv']:.2f}  empty {s['empty_clients']}",
        f"classes per client: mean {s['classes_per_client_mean']:.2f}",
        f"label skew vs global: TV mean {s['tv_mean']:.3f} max {s['tv_max']:.3f} "
        f"(weighted {s['tv_weighted']:.3f}); EMD mean {s['emd_mean']:.3f}",
        "",
        f"{'client':>6} {'size':>7} {'#cls':>4} {'TV':>6}  label counts",
    ]
    for c in report["clients"][:max_clients]:
        tv = "-" if c["tv"] is None else f"{c['tv']:.3f}"
        counts = " ".join(str(v) for v in c["label_counts"])
        lines.append(f"{c['client']:>6} {c['size']:>7} {c['num_classes']:>4} {tv:>6}  {counts}")
    hidden = report["num_clients"] - max_clients
    if hidden > 0:
        lines.append(f"... {hidden} more clients")
    return "\n".join(lines)
