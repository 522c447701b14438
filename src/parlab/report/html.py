"""The report as one self-contained HTML file: inline CSS, figures as inline SVG data URIs,
no script, nothing fetched. Each depth-2 heading opens a ``<section>`` with the heading's id,
so the summary is the page's first section."""

from __future__ import annotations

import base64
import html

from parlab.report.blocks import (
    Badge,
    Block,
    Bullets,
    Fold,
    Heading,
    Image,
    Inline,
    Link,
    Para,
    Parts,
    Report,
    Strong,
    Table,
)
from parlab.report.format import LEVEL_COLOUR

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em auto;
max-width:1180px;padding:0 1em;color:#111;line-height:1.45}
h1{font-size:1.5em;margin-bottom:.2em}h2{border-bottom:2px solid #ddd;margin-top:1.6em}
h3{margin:1.1em 0 .3em}section#summary ul{margin-top:.2em}section#summary li{margin:.15em 0}
table{border-collapse:collapse;margin:.5em 0;font-size:.82em}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f3f4f6;position:sticky;top:0}code{background:#f3f4f6;padding:1px 4px;
font-size:.85em;white-space:pre-wrap;word-break:break-all}
.badge{display:inline-block;color:#fff;border-radius:4px;padding:0 6px;font-size:.78em;
margin:0 3px;white-space:nowrap;vertical-align:baseline}
figure{margin:1.2em 0}figcaption{font-size:.86em;color:#333;max-width:70em}
img{max-width:100%;height:auto;border:1px solid #eee}
details{margin:.6em 0}summary{cursor:pointer;font-weight:600}
tr:target{background:#fef9c3}a{color:#1d4ed8}
"""


def _badge(level: str) -> str:
    colour = LEVEL_COLOUR.get(level, "#444")
    return f'<span class="badge" style="background:{colour}">{html.escape(level)}</span>'


def _inline(part: Inline) -> str:
    if isinstance(part, str):
        return html.escape(part)
    if isinstance(part, Link):
        return f'<a href="{html.escape(part.href)}">{html.escape(part.text)}</a>'
    if isinstance(part, Strong):
        return f"<b>{html.escape(part.text)}</b>"
    assert isinstance(part, Badge)
    return _badge(part.level)


def _parts(parts: Parts) -> str:
    return "".join(_inline(p) for p in parts)


def _svg_uri(svg: str) -> str:
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode()).decode("ascii")


def _table(blk: Table) -> list[str]:
    out = ["<table><thead><tr>"]
    out += [f"<th>{html.escape(h)}</th>" for h in blk.headers]
    out.append("</tr></thead><tbody>")
    for i, row in enumerate(blk.rows):
        rid = blk.row_ids[i] if i < len(blk.row_ids) and blk.row_ids[i] else ""
        attr = f' id="{html.escape(rid)}"' if rid else ""
        out.append(f"<tr{attr}>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    return out


def _blocks(blocks: list[Block] | tuple[Block, ...], out: list[str], *, top: bool) -> None:
    e = html.escape
    open_section = False
    for blk in blocks:
        if isinstance(blk, Heading):
            if top and blk.depth == 2:
                if open_section:
                    out.append("</section>")
                out.append(f'<section id="{e(blk.anchor)}">' if blk.anchor else "<section>")
                open_section = True
                anchor = ""
            else:
                anchor = f' id="{e(blk.anchor)}"' if blk.anchor else ""
            out.append(f"<h{blk.depth}{anchor}>{e(blk.text)}</h{blk.depth}>")
        elif isinstance(blk, Para):
            body = _parts(blk.parts)
            out.append(f"<p><code>{body}</code></p>" if blk.code else f"<p>{body}</p>")
        elif isinstance(blk, Bullets):
            attr = f' id="{e(blk.anchor)}"' if blk.anchor else ""
            out.append(
                f"<ul{attr}>" + "".join(f"<li>{_parts(i)}</li>" for i in blk.items) + "</ul>"
            )
        elif isinstance(blk, Table):
            out += _table(blk)
        elif isinstance(blk, Image):
            badges = "".join(_badge(lvl) for lvl in blk.levels)
            out.append(
                f'<figure id="fig-{e(blk.key)}"><img alt="{e(blk.alt)}" src="{_svg_uri(blk.svg)}">'
                f"<figcaption>{badges}<b>{e(blk.title)}.</b> {e(blk.caption)}</figcaption>"
                "</figure>"
            )
            if blk.table is not None:
                out += _table(blk.table)
        elif isinstance(blk, Fold):
            attr = f' id="{e(blk.anchor)}"' if blk.anchor else ""
            out.append(f"<details{attr}><summary>{e(blk.summary)}</summary>")
            _blocks(blk.blocks, out, top=False)
            out.append("</details>")
    if open_section:
        out.append("</section>")


def to_html(rep: Report) -> str:
    """Self-contained HTML of ``rep``."""
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(rep.title)}</title><style>{_CSS}</style></head><body>",
    ]
    _blocks(rep.blocks, out, top=True)
    out.append("</body></html>")
    return "\n".join(out) + "\n"
