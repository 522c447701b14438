"""What ``parlab collectives`` measured for all_to_all, as the MoE run's reference.

A sweep's measured (bytes, busbw) points -- the reference of the 85 % target, interpolated at
the dispatch's payload -- and a calibration's alpha-beta fit (a prediction of the dispatch
time), found in a results folder or given by path; never from another evidence level.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

from parlab.comm.calibration import load_calibration
from parlab.comm.ops import busbw_factor
from parlab.contract import Metric, Prediction, read_document
from parlab.errors import UsageError


def _walk(obj: Any) -> Any:
    if isinstance(obj, dict):
        yield obj
        for v in obj.values():
            yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)


def calibration_points(
    data: dict[str, Any], group_size: int | None = None
) -> list[tuple[float, float]]:
    """(bytes, busbw B/s) of the all_to_all records in a collectives document, by size."""
    pts = []
    for rec in _walk(data):
        if rec.get("op") not in ("all_to_all", "alltoall"):
            continue
        size = rec.get("size", rec.get("bytes"))
        bw = rec.get("busbw")
        if not isinstance(size, (int, float)) or not isinstance(bw, (int, float)) or size <= 0:
            continue
        if group_size is not None and rec.get("group_size") not in (None, group_size):
            continue
        pts.append((float(size), float(bw)))
    return sorted(set(pts))


def calibration_busbw(cal: dict[str, Any], nbytes: float) -> float | None:
    """busbw (B/s) at ``nbytes``: log-linear interpolation between the calibration's sizes."""
    pts = cal["points"]
    if not pts or nbytes <= 0:
        return None
    if nbytes <= pts[0][0]:
        return pts[0][1]
    if nbytes >= pts[-1][0]:
        return pts[-1][1]
    for (s0, b0), (s1, b1) in itertools.pairwise(pts):
        if s0 <= nbytes <= s1:
            f = (math.log(nbytes) - math.log(s0)) / (math.log(s1) - math.log(s0))
            return b0 + f * (b1 - b0)
    return None


def _fit(path: Path, group_size: int) -> dict[str, Any] | None:
    """The all_to_all alpha-beta fit of a ``parlab collectives --fit`` document, if it has one."""
    cal = load_calibration(path)
    if "all_to_all" not in cal.ops or cal.group_size != group_size:
        return None
    return {
        "fit_run_id": cal.run_id,
        "fit_label": cal.label,
        "fit_predict": lambda nbytes: cal.predict("all_to_all", nbytes, group_size),
    }


def find_calibration(
    results: Path, path: Path | None, group_size: int, backend: str
) -> dict[str, Any] | None:
    """What ``parlab collectives`` measured for all_to_all over ``group_size`` ranks.

    ``run_id``/``points``: a sweep's measured (bytes, busbw) -- the reference of the 85%
    target; ``fit_*``: a calibration's alpha-beta fit (a prediction of the dispatch time).
    ``path`` may be either kind; without it, the newest of each kind in ``results`` whose
    evidence level matches this run's backend. None when there is neither.
    """
    out: dict[str, Any] = {}
    if path is not None:
        doc = read_document(path)
        if doc.workload.get("kind") == "collectives-calibration":
            out.update(_fit(path, group_size) or {})
        else:
            pts = calibration_points(doc.to_json(), group_size)
            if pts:
                out.update(run_id=doc.run_id, points=pts, evidence_level=doc.evidence_level)
        if not out:
            raise UsageError(
                f"{path} holds no all_to_all measurement or fit over {group_size} ranks"
            )
        return out
    folder = results / "PAR-COLLECTIVES"
    if not folder.is_dir():
        return None
    want = "real-nccl" if backend == "nccl" else "cpu-mechanism"
    for p in sorted(folder.glob("*.json"), key=lambda q: q.stat().st_mtime, reverse=True):
        try:
            data = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if data.get("evidence_level") != want or not isinstance(data.get("workload"), dict):
            continue
        if data["workload"].get("kind") == "collectives-calibration":
            if "fit_run_id" not in out:
                try:
                    out.update(_fit(p, group_size) or {})
                except ValueError:
                    continue
        elif "run_id" not in out:
            pts = calibration_points(data, group_size)
            if pts:
                out.update(run_id=data.get("run_id", p.stem), points=pts, evidence_level=want)
    return out or None


def calibrated(
    ranks: list[dict[str, Any]], m: dict[str, Metric], calibration: dict[str, Any] | None
) -> tuple[dict[str, Prediction], dict[str, Any] | None]:
    """What ``parlab collectives`` predicts of the dispatch (its alpha-beta fit; its measured
    busbw at this payload, and this run's busbw against it), and what the workload records of
    the calibration."""
    n = len(ranks)
    d_mean = m["dispatch_bytes"].value or 0.0
    predictions: dict[str, Prediction] = {}
    cal_workload = None
    if calibration and n > 1 and calibration.get("fit_predict") is not None:
        predict = calibration["fit_predict"]
        t_fit = predict(d_mean)
        if t_fit:
            predictions["dispatch_time_alpha_beta"] = Prediction(
                value=t_fit, unit="s", model=calibration["fit_label"]
            )
        curve = ranks[0]["reference_a2a"]
        cal_workload = {
            "fit_run_id": calibration["fit_run_id"],
            "fit_label": calibration["fit_label"],
            "fit_curve": [[c["bytes"], predict(c["bytes"])] for c in curve],
        }
    if calibration and n > 1 and calibration.get("points"):
        bw = calibration_busbw(calibration, d_mean)
        cal_workload = {
            **(cal_workload or {}),
            "run_id": calibration["run_id"],
            "points": calibration["points"],
        }
        if bw:
            a2a_bw = m["a2a_busbw"].value
            sweep = f"collectives-sweep:{calibration['run_id']}"
            m["calibration_a2a_busbw"] = Metric(value=bw / 1e9, unit="GB/s")
            m["a2a_busbw_vs_calibration"] = Metric(
                value=100 * a2a_bw / (bw / 1e9) if a2a_bw else None, unit="%"
            )
            predictions["dispatch_time"] = Prediction(
                value=d_mean * busbw_factor("all_to_all", n) / bw, unit="s", model=sweep
            )
            predictions["dispatch_busbw"] = Prediction(value=bw / 1e9, unit="GB/s", model=sweep)
    return predictions, cal_workload
