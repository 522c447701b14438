"""The report as Markdown, its figures as SVG files beside it (``report_files/``); folds are
``<details>`` blocks, which GitHub and most viewers render."""

from __future__ import annotations

from pathlib import Path

from parlab.contract import atomic_write_text
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


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _inline(part: Inline) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, Link):
        return f"[{part.text}]({part.href})"
    if isinstance(part, Strong):
        return f"**{part.text}**"
    assert isinstance(part, Badge)
    return f"`[{part.level}]`"


def _parts(parts: Parts) -> str:
    return "".join(_inline(p) for p in parts)


def _blocks(
    blocks: list[Block] | tuple[Block, ...], out: list[str], files: dict[str, bytes], d: str
) -> None:
    for blk in blocks:
        if isinstance(blk, Heading):
            anchor = f'<a id="{blk.anchor}"></a>' if blk.anchor else ""
            out.append(f"{'#' * blk.depth} {blk.text}{anchor}\n")
        elif isinstance(blk, Para):
            text = _parts(blk.parts)
            out.append(f"```\n{text}\n```\n" if blk.code else f"{text}\n")
        elif isinstance(blk, Bullets):
            out += [f"- {_parts(i)}" for i in blk.items]
            out.append("")
        elif isinstance(blk, Table):
            out.append("| " + " | ".join(_cell(h) for h in blk.headers) + " |")
            out.append("|" + "---|" * len(blk.headers))
            out += ["| " + " | ".join(_cell(_inline(c)) for c in row) + " |" for row in blk.rows]
            out.append("")
        elif isinstance(blk, Image):
            name = f"{d}/{blk.key}.svg"
            files[name] = blk.svg.encode()
            levels = " ".join(f"`[{lvl}]`" for lvl in blk.levels)
            out.append(f"![{blk.alt}]({name})\n\n**{blk.title}.** {levels} {blk.caption}\n")
            if blk.table is not None:
                _blocks((blk.table,), out, files, d)
        elif isinstance(blk, Fold):
            out.append(f"<details><summary>{blk.summary}</summary>\n")
            _blocks(blk.blocks, out, files, d)
            out.append("</details>\n")


def to_markdown(rep: Report, files_dir: str = "report_files") -> tuple[str, dict[str, bytes]]:
    """Markdown text and the image files it references (relative name -> bytes)."""
    out: list[str] = []
    files: dict[str, bytes] = {}
    _blocks(rep.blocks, out, files, files_dir)
    return "\n".join(out) + "\n", files


def write_markdown(rep: Report, path: Path, files_dir: str = "report_files") -> dict[str, Path]:
    """Write ``rep`` as Markdown to ``path`` and its figures under ``path.parent/files_dir``;
    returns each figure's path by block key, and the Markdown's as ``report``."""
    text, files = to_markdown(rep, files_dir)
    out: dict[str, Path] = {}
    for name, data in files.items():
        target = path.parent / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        out[Path(name).stem] = target
    atomic_write_text(path, text)
    out["report"] = path
    return out
