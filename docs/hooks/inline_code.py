"""MkDocs hook: code that wraps where a reader expects it to.

* Inline code: a path such as ``reference_impl/parallel/tensor_parallel.py`` is one
  unbreakable word to the browser (Chromium offers no line break after "/" inside it). On a
  phone it then either runs off the screen or, under Material's ``word-break: break-word``
  for code, is cut wherever the line ends ("01_ring_al" / "lreduce"). A ``<wbr>`` (an
  optional line break, invisible and not copied) after every slash lets a path wrap between
  its folders.
* Code blocks wrap their long lines (docs/assets/stylesheets/code.css). Each line is its own
  span (pymdownx.highlight's ``line_spans``); this hook gives the span its indentation as
  ``--indent``, so that the stylesheet can start a wrapped continuation four characters to
  the right of where its line starts, never at the margin where it would read as a new line.
"""
from __future__ import annotations

import html as html_lib
import re

# Inline code as Python-Markdown writes it: <code>text</code> with no markup inside.
# Code blocks carry highlighting spans inside their <code>, so they never match.
_INLINE_CODE = re.compile(r"<code>([^<]*)</code>")
_SLASH = re.compile(r"/(?=[^/\s])")
# One line of a code block: its span's start tag and what follows up to the next line or the end.
_LINE = re.compile(r'<span id="(__span-\d+-\d+)">(.*?)(?=<span id="__span-|</code>)', re.DOTALL)
_TAG = re.compile(r"<[^>]+>")
MAX_INDENT = 12  # characters


def _breakable(match: re.Match) -> str:
    return "<code>" + _SLASH.sub("/<wbr>", match.group(1)) + "</code>"


def _indented(match: re.Match) -> str:
    text = html_lib.unescape(_TAG.sub("", match.group(2)))
    # Capped, so that a deeply indented line still leaves most of a phone's width to its text.
    indent = min(len(text) - len(text.lstrip(" ")), MAX_INDENT)
    if not indent or not text.strip():
        return match.group(0)
    return f'<span id="{match.group(1)}" style="--indent: {indent}ch">{match.group(2)}'


def on_page_content(html: str, page, config, files) -> str:
    html = _INLINE_CODE.sub(_breakable, html)
    return _LINE.sub(_indented, html)
