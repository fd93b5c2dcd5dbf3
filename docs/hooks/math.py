"""MkDocs hook: turn LaTeX into MathML at build time, so formulas need no JavaScript.

``pymdownx.arithmatex`` in ``generic`` mode leaves every formula in the page HTML as

* ``<span class="arithmatex">\\(...\\)</span>`` for inline math, and
* ``<div class="arithmatex">\\[...\\]</div>`` for display math,

with the LaTeX HTML-escaped. This hook replaces each with the MathML that ``latex2mathml``
produces (``display="block"`` for the div form). Browsers render MathML natively, so the
site shows math offline, with no script and no network request.

A formula that cannot be converted fails the build with the page and the LaTeX in the
message. ``latex2mathml`` passes commands it does not know through as text (``\\foo``
becomes ``<mi>\\foo</mi>``) instead of raising, so the output is checked as well: it must
be well-formed XML and no token may still hold a backslash command or a bare ``&``.
"""
from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET

from latex2mathml.converter import convert
from mkdocs.exceptions import PluginError

_INLINE = re.compile(r'<span class="arithmatex">\\\((.*?)\\\)</span>', re.DOTALL)
_BLOCK = re.compile(r'<div class="arithmatex">\\\[(.*?)\\\]</div>', re.DOTALL)
_LEFTOVER_COMMAND = re.compile(r"\\[A-Za-z]+")


def _fail(page, latex: str, why: str) -> PluginError:
    snippet = " ".join(latex.split())
    return PluginError(
        f"math hook: cannot convert a formula on page '{page.file.src_uri}' to MathML ({why}).\n"
        f"  LaTeX: {snippet}\n"
        "  Fix the formula, or rewrite it with commands latex2mathml supports."
    )


def _check(mathml: str, page, latex: str) -> None:
    try:
        root = ET.fromstring(mathml)
    except ET.ParseError as exc:
        raise _fail(page, latex, f"the MathML is not well-formed: {exc}") from None
    for node in root.iter():
        text = node.text or ""
        command = _LEFTOVER_COMMAND.search(text)
        if command:
            raise _fail(page, latex, f"unsupported command {command.group(0)}")
        if text.strip() == "&":
            raise _fail(page, latex, "'&' outside an environment that aligns on it")


def _to_mathml(latex_html: str, display: str, page) -> str:
    latex = html.unescape(latex_html).strip()
    if not latex:
        raise _fail(page, latex_html, "the formula is empty")
    try:
        mathml = convert(latex, display=display)
    except Exception as exc:  # noqa: BLE001 - latex2mathml raises many exception types for bad input
        raise _fail(page, latex, f"{type(exc).__name__}: {exc}") from None
    _check(mathml, page, latex)
    return mathml


def on_page_content(html_text: str, page, config, files) -> str:
    if "arithmatex" not in html_text:
        return html_text
    html_text = _BLOCK.sub(
        lambda m: '<div class="arithmatex">' + _to_mathml(m.group(1), "block", page) + "</div>",
        html_text,
    )
    html_text = _INLINE.sub(
        lambda m: '<span class="arithmatex">' + _to_mathml(m.group(1), "inline", page) + "</span>",
        html_text,
    )
    leftover = re.search(r'class="arithmatex">\s*(\\[(\[].{0,80})', html_text, re.DOTALL)
    if leftover:
        # A wrapper whose delimiters did not match the patterns above: never ship raw LaTeX.
        raise _fail(page, leftover.group(1), "unrecognised arithmatex markup")
    return html_text
