"""MkDocs hook: give the calculator pages their constants from the reference code.

A calculator page (``docs/calculators/*.md``) holds a form and the marker
``<!-- calculators:constants -->``. This hook replaces the marker with a JSON block of
``reference_impl.calculators.calculator_constants()`` (interconnect profiles with their α
and β, allreduce algorithms, optimiser state sizes), which ``docs/assets/js/calculators.js``
reads in the browser. When ``docs/assets/bench/alpha_beta.json`` exists, the link fitted
on the benchmark machine is one more profile ("measured on this machine"). The numbers therefore come from the same Python objects the cost
models and simulated network use, and change with them on the next build.
"""
from __future__ import annotations

import json
from pathlib import Path

from mkdocs.exceptions import PluginError
from reference_impl.calculators import calculator_constants

MARKER = "<!-- calculators:constants -->"


def _alpha_beta_json(config) -> Path | None:
    path = Path(config["docs_dir"]) / "assets" / "bench" / "alpha_beta.json"
    return path if path.is_file() else None


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        if page.file.src_uri.startswith("calculators/") and "data-calculator=" in markdown:
            raise PluginError(f"calculators hook: {page.file.src_uri} has a calculator form "
                              f"but no {MARKER} marker, so its script would have no constants")
        return markdown
    try:
        constants = calculator_constants(_alpha_beta_json(config))
    except ValueError as exc:
        raise PluginError(f"calculators hook: {exc}\n  Run `make bench` to measure it again.") from exc
    payload = json.dumps(constants, sort_keys=True).replace("</", "<\\/")
    block = f'<script type="application/json" id="calculator-constants">{payload}</script>'
    return markdown.replace(MARKER, block)
