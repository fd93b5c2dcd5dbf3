"""MkDocs hook: diagrams whose text stays readable on a phone.

A diagram (``assets/diagrams/*.svg``) is drawn about 900 units wide with 9–12 unit text.
Scaled down to a phone's 330 px text column, that text would be 3–4 px: unreadable. So each
diagram gets a minimum width at which its smallest text is ``MIN_PX`` pixels, computed here
from the SVG itself (its viewBox width and its smallest font size), and sits in a box that
scrolls sideways when the column is narrower. On a wide screen nothing changes: the image
is as wide as the text column (docs/assets/stylesheets/figures.css). The scrolling box can
be focused with the keyboard (``tabindex``), so it can be scrolled without a mouse, and is
named for screen readers.

Text sizes are read from ``font-size`` attributes and style rules (hand-drawn diagrams), and
from the scale of each text path (diagrams drawn by Matplotlib, which turns text into paths
inside ``<g id="text_N">`` groups, scaled by size / 100).
"""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path

MIN_PX = 9.0  # the smallest text of a diagram, in CSS pixels, whatever the screen

_IMG = re.compile(r'<img\b[^>]*\bsrc="(?P<src>[^"]*assets/diagrams/(?P<name>[\w.-]+\.svg))"[^>]*>')
_VIEWBOX = re.compile(r'<svg\b[^>]*\bviewBox="\s*[-\d.]+[\s,]+[-\d.]+[\s,]+([\d.]+)')
_FONT_SIZE = re.compile(r'font-size\s*[=:]\s*"?\s*([\d.]+)')
_TEXT_PATH_SCALE = re.compile(r'<g id="text_\d+"[^>]*>\s*(?:<!--.*?-->\s*)?<g transform="[^"]*scale\(([\d.]+) -', re.S)


@cache
def smallest_text(svg: Path) -> tuple[float, float]:
    """(viewBox width, smallest font size in the same units) of a diagram."""
    content = svg.read_text(encoding="utf-8")
    viewbox = _VIEWBOX.search(content)
    if viewbox is None:
        raise ValueError(f"{svg}: no viewBox, so its text cannot be sized for a phone")
    sizes = [float(s) for s in _FONT_SIZE.findall(content)]
    sizes += [float(s) * 100 for s in _TEXT_PATH_SCALE.findall(content)]
    if not sizes:
        raise ValueError(f"{svg}: no text size found (font-size, or Matplotlib's text paths)")
    return float(viewbox.group(1)), min(sizes)


def min_width_px(svg: Path) -> int:
    """The narrowest width (CSS px) at which the diagram's smallest text is ``MIN_PX``."""
    width, smallest = smallest_text(svg)
    return int(-(-width * MIN_PX // smallest))  # rounded up


def on_page_content(html: str, page, config, files) -> str:
    docs = Path(config["docs_dir"])

    def wrap(match: re.Match) -> str:
        svg = docs / "assets" / "diagrams" / match.group("name")
        if not svg.is_file():
            return match.group(0)  # a broken link: --strict's link check names it
        return (f'<span class="diagram-scroll" tabindex="0" role="group" '
                f'aria-label="Diagram; on a narrow screen it scrolls sideways" '
                f'style="--diagram-min-width: {min_width_px(svg)}px">{match.group(0)}</span>')

    return _IMG.sub(wrap, html)
