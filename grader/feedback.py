"""The feedback page: one self-contained HTML file rendered from grading records.

``check`` writes one for a learner's notebook (``grader-feedback/<assignment>/<notebook>.html``),
and the instructor's ``feedback`` writes one per student over all of their submissions; both
come from the same records (``GradingResult.to_json``), never from the executed notebook, so
what the page can show is exactly what the record holds: per test its name, points, time,
result, the failure, the learner's own failing line, the instructor's hint and a link to the
paragraph of the site that explains it. No test code, no traceback through the grader, no
token: there is none of that in a record.

The page loads nothing: styles are inline, there is no script, and math written as
``$...$`` in a hint becomes MathML (as on the site), so it renders offline in any browser.
It reflows on a phone (one card per test, long lines wrap) and follows the reader's dark mode.
"""
from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from .report import GradingResult

_STYLE = """
:root{color-scheme:light dark;--fg:#1f2328;--bg:#fff;--muted:#59636e;--line:#d1d9e0;--pass:#1a7f37;--fail:#cf222e;
--note:#fff8c5;--card:#f6f8fa}
@media (prefers-color-scheme:dark){:root{--fg:#e6edf3;--bg:#0d1117;--muted:#9198a1;--line:#3d444d;--pass:#3fb950;
--fail:#f85149;--note:#3b2e00;--card:#151b23}}
*{box-sizing:border-box}
body{font:16px/1.5 system-ui,-apple-system,"Segoe UI","Noto Sans","Noto Sans CJK SC",sans-serif;color:var(--fg);
background:var(--bg);max-width:52rem;margin:0 auto;padding:1rem;overflow-wrap:anywhere}
h1{font-size:1.5rem;margin:.5rem 0}h2{font-size:1.2rem;margin:1.5rem 0 .5rem}
.score{font-size:1.25rem;font-weight:600}
.test{border:1px solid var(--line);border-left:.35rem solid var(--line);border-radius:.4rem;padding:.5rem .75rem;
margin:.5rem 0;background:var(--card)}
.test.pass{border-left-color:var(--pass)}.test.fail{border-left-color:var(--fail)}
.head{display:flex;flex-wrap:wrap;gap:.25rem 1rem;align-items:baseline}
.name{font-family:ui-monospace,"SFMono-Regular",Menlo,Consolas,monospace;font-weight:600;overflow-wrap:anywhere}
.meta{color:var(--muted);font-size:.9rem}.result.pass{color:var(--pass)}.result.fail{color:var(--fail)}
pre,code{font-family:ui-monospace,"SFMono-Regular",Menlo,Consolas,monospace;font-size:.9rem}
pre{white-space:pre-wrap;overflow-wrap:anywhere;margin:.4rem 0;padding:.4rem .5rem;border-radius:.3rem;
background:var(--bg);border:1px solid var(--line)}
.hint{margin:.4rem 0}.note{background:var(--note);padding:.5rem .75rem;border-radius:.3rem;margin:.5rem 0}
a{color:inherit;word-break:break-all}math{font-size:1.05em;max-width:100%;overflow-x:auto}
"""
_MATH = re.compile(r"\$([^$\n]+)\$")


def _math(text: str) -> str:
    """``text`` HTML-escaped, with each ``$...$`` as inline MathML (left as text if it does not convert)."""
    from latex2mathml.converter import convert

    parts, last = [], 0
    for match in _MATH.finditer(text):
        parts.append(html.escape(text[last:match.start()]))
        try:
            parts.append(convert(match.group(1)))
        except Exception:  # noqa: BLE001 - latex2mathml raises many types for bad input: keep the text
            parts.append(html.escape(match.group(0)))
        last = match.end()
    parts.append(html.escape(text[last:]))
    return "".join(parts)


def _link(url: str | None, text: str) -> str:
    return f'<a href="{html.escape(url, quote=True)}">{html.escape(text)}</a>' if url else ""


def _test(t: dict[str, Any]) -> str:
    word, cls = ("pass", "pass") if t["passed"] else ("FAIL", "fail")
    seconds = f"{t['seconds']:.2f} s" if t.get("seconds") is not None else "not run"
    parts = [f'<section class="test {cls}"><div class="head"><span class="name">{html.escape(t["id"])}</span>'
             f'<span class="result {cls}">{word}</span>'
             f'<span class="meta">{t["score"]:g} / {t["max_score"]:g} points &middot; {seconds}</span></div>']
    if t.get("hint") and not t["passed"]:
        parts.append(f"<pre>{html.escape(t['hint'])}</pre>")
    if t.get("line"):
        parts.append(f'<p class="hint">Your line: <code>{html.escape(t["line"])}</code></p>')
    if t.get("advice"):
        parts.append(f'<p class="hint"><strong>Hint:</strong> {_math(t["advice"])}</p>')
    if t.get("read"):
        parts.append(f'<p class="hint">Read: {_link(t["read"], t["read"])}</p>')
    parts.append("</section>")
    return "".join(parts)


def _record(r: dict[str, Any], heading: str) -> str:
    parts = [f"<h2>{html.escape(heading)}</h2>",
             f'<p class="score">{r["score"]:g} / {r["max_score"]:g} points</p>']
    if r.get("error"):
        parts.append(f'<p class="note">Grading did not complete: {html.escape(r["error"])}</p>')
    for e in r.get("cell_errors", []):
        at = f"<br>at <code>{html.escape(e['line'])}</code>" if e.get("line") else ""
        parts.append(f'<p class="note">Fix first: cell <code>{html.escape(e["cell"])}</code>: '
                     f"{html.escape(e['error'])}{at}</p>")
    for test, names in list(r.get("threads", {}).items())[:1]:
        parts.append(f'<p class="note">Threads your code started were still running at test '
                     f"<code>{html.escape(test)}</code>: {html.escape(names)}. They take CPU from every test "
                     "after it: end them, or join them before returning.</p>")
    if r.get("tampered"):
        parts.append('<p class="note">Locked cells changed in the notebook were graded with their original '
                     f"text: {html.escape(', '.join(r['tampered']))}</p>")
    parts += [_test(t) for t in r.get("tests", [])]
    if r.get("concept_page"):
        parts.append(f"<p>Concept page: {_link(r['concept_page'], r['concept_page'])}</p>")
    return "\n".join(parts)


def render_page(title: str, records: list[dict[str, Any]]) -> str:
    """The whole page: a title, the total when there are several records, then each record."""
    body = [f"<h1>{html.escape(title)}</h1>"]
    if len(records) > 1:
        total = sum(r["score"] for r in records)
        possible = sum(r["max_score"] for r in records)
        body.append(f'<p class="score">Total: {total:g} / {possible:g} points over {len(records)} submissions</p>')
    for r in records:
        if len(records) == 1 and r.get("notebook"):  # the title names the assignment already
            heading = r["notebook"]
        else:
            heading = r.get("assignment") or "(assignment not recognised)"
            if r.get("submission"):
                heading += f": {r['submission']}"
        body.append(_record(r, heading))
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def write_feedback_page(path: Path, result: GradingResult) -> Path:
    """Write the feedback page of one grading ``result`` to ``path``; returns ``path``."""
    import json

    record = json.loads(result.to_json())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_page(f"Feedback: {result.assignment}", [record]), encoding="utf-8")
    return path
