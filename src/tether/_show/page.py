"""The self-contained HTML page of a session timeline (``tether show SESSION --html FILE``).

One file, no network: the timeline's JSON document sits in a ``<script
type="application/json">`` element and a small inline script draws it — a horizontal time
axis (idle stretches longer than the typical operation are compressed and marked), one
lane per operation, boxes for model attempts and tool calls sized by duration, red crash
markers and blue stop markers, a legend that says in words what each colour means, the
transcript beside the lanes, and the details of a box on click (a tooltip on hover).

Both lists are virtualised: only the rows in view exist in the DOM, so a 10,000-turn
session opens as fast as a short one. The page's size is the JSON document plus a fixed
few kilobytes.
"""

from __future__ import annotations

import os
import tempfile
from importlib import resources
from pathlib import Path
from typing import Final

import orjson

from tether.core.timeline import Timeline

__all__ = ["page_html", "write_page"]

_ASSETS: Final = resources.files("tether._show")
"""The page's style sheet and script (``page.css``, ``page.js``), inlined into every page."""


_LEGEND = (
    ("#5c6bc0", "model attempt (settled)"),
    ("#9fa8da", "model attempt superseded by a retry"),
    ("#c62828", "failed attempt / crash: the process was down"),
    ("#2e7d32", "tool call: success"),
    ("#ef6c00", "tool call: error"),
    ("#f9a825", "tool call: interrupted, aborted or truncated"),
    ("#8e24aa", "no result recorded (open)"),
    ("#00acc1", "outline: result recorded by recovery after a crash"),
    ("#1565c0", "■ stop: idle (the process ended or waited)"),
    ("#00838f", "⧖ queued: a run accepted and waiting to be picked up"),
)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def page_html(timeline: Timeline) -> bytes:
    """The whole page as UTF-8 bytes."""
    style = (_ASSETS / "page.css").read_text(encoding="utf-8")
    script = (_ASSETS / "page.js").read_text(encoding="utf-8")
    data = orjson.dumps(timeline.to_json())
    # Inside <script> nothing may close the element: escape every "<" (valid JSON still).
    data = data.replace(b"<", b"\\u003c")
    legend = "".join(
        f'<span><span class="sw" style="background:{colour}"></span>{_escape(text)}</span>'
        for colour, text in _LEGEND
    )
    title = _escape(f"tether session {timeline.session_id}")
    head = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"
        f"<title>{title}</title><style>{style}</style></head><body>"
        f'<header><h1>{title}</h1><div class="meta" id="meta"></div></header>'
        f'<div id="legend">{legend}</div><div id="gaps"></div>'
        '<div id="main"><div id="lanes"><div id="toolbar"><button id="fit">fit</button>'
        '<button id="zin">zoom in</button><button id="zout">zoom out</button> '
        "click a lane's name to zoom to it, a box for its details</div>"
        '<div id="axis"></div><div id="scroller"><div id="rows"></div></div></div>'
        '<div id="side"><h2>Transcript</h2><div id="transcript"><div id="tinner"></div></div>'
        '<div id="detailsbox"><h2>Details</h2><pre id="details"></pre></div></div></div>'
        '<script type="application/json" id="timeline-data">'
    )
    tail = f"</script><script>{script}</script></body></html>\n"
    return head.encode() + data + tail.encode()


def write_page(timeline: Timeline, path: Path) -> int:
    """Write the page to ``path`` atomically (temporary name, rename); its size."""
    data = page_html(timeline)
    folder = path.parent if str(path.parent) else Path(".")
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return len(data)
