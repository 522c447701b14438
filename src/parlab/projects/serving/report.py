"""The serving project's report: ``parlab.report.blocks`` (headings, paragraphs, tables)
built from the run's documents alone, written by ``parlab.report.markdown.write_markdown``."""

from __future__ import annotations

import time
from pathlib import Path

from parlab.contract import Document
from parlab.projects.serving.config import PROJECT
from parlab.report.blocks import Block, Heading, Para, Report, Table
from parlab.report.markdown import write_markdown

POLICY_COLUMNS = (
    "policy",
    "engine",
    "ok/failed",
    "req/s",
    "TTFT mean / p99 ms",
    "TPOT mean / p99 ms",
    "cache hit (server)",
    "cache hit (router est.)",
    "per-replica load",
    "router p99 ms",
    "sim TTFT / TPOT error (idle profile)",
    "sim TTFT / TPOT error (step costs of the first run)",
)


def _v(d: Document, k: str, fmt: str = "{:.2f}") -> str:
    x = d.metric(k)
    return "unknown" if x is None else fmt.format(x)


def _err(d: Document, k: str, suffix: str = "") -> str:
    m, pr = d.metric(k), d.predictions.get(k + suffix)
    if m is None or pr is None or pr.value is None or not m:
        return "unknown"
    return f"{(pr.value - m) / m:+.0%}"


def _policy_row(d: Document) -> tuple[str, ...]:
    load = d.metrics.get("replica_load_routed")
    engines = sorted({f"{r['engine']} {r['version']}" for r in d.layout.get("engines", [])})
    return (
        str(d.layout.get("policy")),
        ", ".join(engines) or "-",
        f"{_v(d, 'completed', '{:.0f}')}/{_v(d, 'failed', '{:.0f}')}",
        _v(d, "request_throughput"),
        f"{_v(d, 'mean_ttft_ms')} / {_v(d, 'p99_ttft_ms')}",
        f"{_v(d, 'mean_tpot_ms')} / {_v(d, 'p99_tpot_ms')}",
        _v(d, "cache_hit_rate", "{:.1%}"),
        _v(d, "router_est_cache_hit_rate", "{:.1%}"),
        str([int(x or 0) for x in (load.per_rank or [])]) if load else "-",
        _v(d, "router_pre_forward_p99_ms", "{:.3f}"),
        f"{_err(d, 'mean_ttft_ms')} / {_err(d, 'mean_tpot_ms')}",
        f"{_err(d, 'mean_ttft_ms', '@in_run')} / {_err(d, 'mean_tpot_ms', '@in_run')}",
    )


def report_blocks(docs: list[Document], extra: list[Document]) -> Report:
    """The report: the policies compared, then each other run's metrics."""
    first = docs[0] if docs else None
    blocks: list[Block] = [Heading(depth=1, text="Serving: routing policies compared")]
    if first is not None:
        blocks.append(
            Para(
                parts=(
                    f"Workload {first.workload.get('dataset')} "
                    f"{first.workload.get('dataset_params')}; "
                    f"rate {first.workload.get('request_rate')} req/s [{first.evidence_level}].",
                )
            )
        )
        blocks.append(Table(headers=POLICY_COLUMNS, rows=tuple(_policy_row(d) for d in docs)))
    base = next((d for d in docs if d.layout.get("policy") == "round_robin"), None)
    ca = next((d for d in docs if d.layout.get("policy") == "cache_aware"), None)
    if base and ca:
        hb, hc = base.metric("cache_hit_rate"), ca.metric("cache_hit_rate")
        tb, tc = base.metric("mean_ttft_ms"), ca.metric("mean_ttft_ms")
        hit = f"{hc / hb:.2f}x" if hb and hc is not None else "unknown"
        ttft = f"{tc / tb:.2f}x" if tb and tc is not None else "unknown"
        blocks.append(
            Para(
                parts=(
                    f"cache_aware against round_robin: cache-hit ratio {hit}, mean TTFT {ttft}.",
                )
            )
        )
    for d in extra:
        title = f"{d.layout.get('strategy')} (run {d.run_id})"
        blocks.append(Heading(depth=2, text=f"{title} [{d.evidence_level}]"))
        rows = tuple(
            (k, "unknown" if m.value is None else f"{m.value:.4g}", m.unit)
            for k, m in d.metrics.items()
        )
        blocks.append(Table(headers=("metric", "value", "unit"), rows=rows))
        blocks += [Para(parts=(n,)) for n in d.notes]
    blocks.append(Para(parts=("Documents: " + ", ".join(d.run_id for d in docs + extra),)))
    return Report(title="Serving", blocks=blocks, run_ids=[d.run_id for d in docs + extra])


def write_report(root: Path, docs: list[Document], extra: list[Document]) -> Path:
    """The report as Markdown under ``root/<project>/``; its path."""
    path = root / PROJECT / f"serving-report-{time.strftime('%Y%m%dT%H%M%S')}.md"
    write_markdown(report_blocks(docs, extra), path)
    return path
