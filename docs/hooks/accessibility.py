"""MkDocs hook: name the theme's search dialog for assistive technology.

Material for MkDocs marks its search box ``role="dialog"`` without a name, so a screen reader
announces only "dialog" and axe-core reports ``aria-dialog-name`` (serious) on every page.
The hook gives it ``aria-label="Search"`` in the written HTML; if the theme's markup ever
changes so that the dialog is no longer found, the build fails rather than silently dropping
the name (tests/test_accessibility.py checks every page in Chromium).
"""
from __future__ import annotations

_DIALOG = '<div class="md-search" data-md-component="search" role="dialog">'
_NAMED = '<div class="md-search" data-md-component="search" role="dialog" aria-label="Search">'


def _named(output: str, where: str) -> str:
    if 'class="md-search"' not in output:
        return output  # a page without the theme's search box
    if _DIALOG not in output:
        raise ValueError(f"{where}: the theme's search dialog markup changed; update docs/hooks/accessibility.py")
    return output.replace(_DIALOG, _NAMED, 1)


def on_post_page(output: str, page, config) -> str:
    return _named(output, page.file.src_uri)


def on_post_template(output: str, template_name: str, config) -> str:
    """The theme's own pages, such as 404.html, which are not Markdown pages."""
    return _named(output, template_name)
