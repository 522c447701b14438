"""The report in a real headless Chromium: it renders, shows its plots, logs no errors.

Chromium is driven through the DevTools protocol over a websocket (aiohttp):
the page's console messages (``Runtime.consoleAPICalled``), uncaught
exceptions (``Runtime.exceptionThrown``) and browser log entries
(``Log.entryAdded``: failed loads, blocked resources) are collected while it
loads; then the page is asked how many images it holds, whether each decoded
(``naturalWidth > 0``) and is laid out with a size. A deliberately broken page
is loaded in the same browser to prove the checks catch what they claim to.

Needs Debian's chromium at ``/usr/bin/chromium`` (``apt-get install -y
chromium``); skipped with that reason where it is absent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
    "--window-size=1280,1000",
]

pytestmark = [
    pytest.mark.skipif(
        not Path(CHROMIUM).exists(),
        reason=f"{CHROMIUM} is absent: install Debian's chromium (apt-get install -y chromium)",
    ),
    pytest.mark.timeout(90),
]

PROBE = """JSON.stringify({
  title: document.title,
  text: document.body.textContent,
  images: Array.from(document.images).map(i => ({
    ok: i.complete && i.naturalWidth > 0,
    w: i.getBoundingClientRect().width,
    h: i.getBoundingClientRect().height,
    alt: i.alt})),
  figures: document.querySelectorAll('figure').length,
  tables: document.querySelectorAll('table').length,
  first: Array.from(document.body.children).slice(0, 2).map(e => e.tagName + '#' + e.id),
  summaryTop: (document.querySelector('section#summary') || {getBoundingClientRect: () =>
    ({top: -1})}).getBoundingClientRect().top,
  figureTops: Array.from(document.querySelectorAll('figure')).map(f =>
    f.getBoundingClientRect().top),
  captions: Array.from(document.querySelectorAll('figure')).map(f => ({
    alt: (f.querySelector('img') || {}).alt || '',
    caption: (f.querySelector('figcaption') || {}).innerText || ''})),
  folded: Array.from(document.querySelectorAll('details')).map(d => d.open),
})"""


class Page:
    """One DevTools page session: navigate, collect errors, evaluate."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0
        self.errors: list[str] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        my_id = self.next_id
        await self.ws.send_json({"id": my_id, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json(timeout=30)
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._event(msg)

    def _event(self, msg: dict[str, Any]) -> None:
        method, p = msg.get("method"), msg.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            self.errors.append(
                "console: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"])
            )
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            self.errors.append(f"exception: {d.get('exception', {}).get('description', d)}")
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            e = p["entry"]
            self.errors.append(f"log: {e.get('text')} {e.get('url', '')}".strip())

    async def load(self, url: str) -> dict[str, Any]:
        self.errors = []
        await self.call("Page.navigate", url=url)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = await self.ws.receive_json(timeout=30)
            self._event(msg)
            if msg.get("method") == "Page.loadEventFired":
                break
        # let late errors (decoding, scripts) arrive, then drain them
        await asyncio.sleep(0.5)
        with contextlib.suppress(asyncio.TimeoutError):
            while True:
                self._event(await self.ws.receive_json(timeout=0.2))
        res = await self.call("Runtime.evaluate", expression=PROBE, returnByValue=True)
        return json.loads(res["result"]["value"])


async def _inspect(port: int, urls: list[str]) -> list[tuple[dict[str, Any], list[str]]]:
    import aiohttp

    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://127.0.0.1:{port}/json/list") as r:
            targets = await r.json()
        ws_url = next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"]
        async with s.ws_connect(ws_url, max_msg_size=0) as ws:
            page = Page(ws)
            for m in ("Page.enable", "Runtime.enable", "Log.enable"):
                await page.call(m)
            out = []
            for url in urls:
                probe = await page.load(url)
                out.append((probe, list(page.errors)))
            return out


def inspect_in_chromium(paths: list[Path]) -> list[tuple[dict[str, Any], list[str]]]:
    """Open each file in one headless Chromium; (probe, errors) per file."""
    user_dir = Path(tempfile.mkdtemp(prefix="parlab-chromium-"))
    proc = subprocess.Popen(
        [CHROMIUM, *FLAGS, f"--user-data-dir={user_dir}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = user_dir / "DevToolsActivePort"
        deadline = time.monotonic() + 45
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"chromium did not start (exit {proc.poll()})")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        return asyncio.run(_inspect(port, [p.resolve().as_uri() for p in paths]))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(user_dir, ignore_errors=True)


def caption_problems(captions: list[dict[str, str]]) -> list[str]:
    """Figures without a real alt text or without a caption that names the evidence level."""
    out = []
    for i, fig in enumerate(captions):
        if len(fig["alt"]) <= 40:
            out.append(f"figure {i}: alt text {fig['alt']!r}")
        if "Evidence level" not in fig["caption"]:
            out.append(f"figure {i}: caption {fig['caption']!r}")
    return out


def test_report_renders_in_chromium_with_plots_and_no_errors(tmp_path: Path) -> None:
    from parlab.report import build_report
    from tests.test_report import populate

    docs = populate(tmp_path / "results")
    out = build_report(tmp_path / "results", tmp_path / "report")
    broken = tmp_path / "broken.html"
    broken.write_text(
        "<!DOCTYPE html><html><head><title>broken</title></head><body>"
        '<img alt="bad" src="data:image/png;base64,AAAA">'
        '<figure><img src="data:image/png;base64,AAAA"></figure>'
        "<script>console.error('planted'); undefinedFunction();</script></body></html>"
    )
    (report, errors), (bad, bad_errors) = inspect_in_chromium([out.html, broken])

    assert errors == [], errors
    assert report["title"].startswith("parlab report")
    for d in docs.values():
        assert d.run_id in report["text"] and d.evidence_level in report["text"]
    # the summary is the first thing on the page, above every figure
    assert report["first"] == ["H1#top", "SECTION#summary"], report["first"]
    assert 0 <= report["summaryTop"] < min(report["figureTops"])
    # every figure has alt text and a caption naming its evidence level
    assert len(report["captions"]) == out.figures >= 6
    assert caption_problems(report["captions"]) == []
    assert len(report["images"]) == out.figures
    for img in report["images"]:
        assert img["ok"], f"image did not decode: {img['alt']}"
        assert img["w"] > 300 and img["h"] > 100, img
    assert report["figures"] == len(report["images"]) and report["tables"] >= 3
    assert report["folded"] == [False]  # the asset table starts folded

    # the same checks do catch a broken page
    assert not bad["images"][0]["ok"] and bad["first"] != report["first"]
    assert caption_problems(bad["captions"]) != []
    assert any("planted" in e for e in bad_errors), bad_errors
    assert any("undefinedFunction" in e for e in bad_errors), bad_errors
