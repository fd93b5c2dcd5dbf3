"""Plots, diagrams, math and Chinese text as a reader sees them: on a phone, in both colour schemes.

* Every measured plot (docs/hooks/plot_*.py through plotkit.svg) has text large enough to read
  when the figure is shown at phone width, a transparent background, log ticks without
  "×10⁰", and series told apart by line style and marker, not by colour alone.
* The plot palette keeps 3:1 contrast against the light page and, through the dark scheme's
  CSS filter, against the dark page.
* In Chromium on the built site at 360 px: no plot runs off the screen, each plot's smallest
  text is at least 9 px, each diagram's smallest text too (a wide diagram scrolls sideways in
  a box of its own, which the keyboard can focus), the dark scheme re-colours plots and diagrams (light: no filter),
  fractions inside tables are as large as the table's text, and the glossary's Chinese
  column is drawn with a real CJK font (two different characters draw differently; with no
  CJK font both are the same empty box). Screenshots go to build/test-artifacts/.
"""
from __future__ import annotations

import math
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from browser_tools import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, chromium_or_skip

ROOT = Path(__file__).resolve().parents[1]
PHONE = {"width": 360, "height": 780}
MIN_PX = 9.0  # smallest plot text on a 360 px screen
SVG_NS = "{http://www.w3.org/2000/svg}"
JIT_PAGE = "concepts/jit-compilation/"
MIXED_PAGE = "concepts/mixed-precision/"


# --------------------------------------------------------------------------- the plotters


@pytest.fixture(scope="module")
def figures():
    """{name: (matplotlib Figure after finishing, SVG bytes)} for every plot of every benchmark file."""
    import math as _math  # noqa: F401  (the stdlib math first: docs/hooks/ has a math.py hook)

    hooks = str(ROOT / "docs" / "hooks")
    sys.path.append(hooks)
    try:
        import plotkit

        captured: list = []
        original = plotkit.svg

        def keep(fig):
            out = original(fig)
            captured.append(fig)
            return out

        plotkit.svg = keep
        import bench_plots  # imports every plotter, which take plotkit.svg by name

        for mod in list(sys.modules.values()):
            if getattr(mod, "svg", None) is original and getattr(mod, "NAME", None):
                mod.svg = keep
        out = {}
        for path in sorted((ROOT / "docs/assets/bench").glob("*.json")):
            data = plotkit.load(path)
            plotter = bench_plots.PLOTTERS.get(data["benchmark"])
            if plotter is None:
                continue
            captured.clear()
            svgs, _ = plotter(path, data)
            assert len(captured) == len(svgs), f"{path.name}: a figure was not drawn through plotkit.svg"
            for (kind, content), fig in zip(svgs.items(), captured):
                out[f"{path.stem}-{kind}"] = (fig, content)
        plotkit.svg = original
        return out
    finally:
        sys.path.remove(hooks)


def svg_text_sizes(content: bytes) -> tuple[float, list[tuple[str, float]]]:
    """(viewBox width in pt, [(text, font size in pt)]) of a Matplotlib SVG whose text is drawn
    as paths: each text is a ``<g id="text_N">`` whose first ``scale(s -s)`` is size / 100."""
    root = ET.fromstring(content)
    width = float(root.get("viewBox").split()[2])
    sizes = []
    for group in root.iter(f"{SVG_NS}g"):
        if not re.fullmatch(r"text_\d+", group.get("id") or ""):
            continue
        for inner in group.iter(f"{SVG_NS}g"):
            m = re.search(r"scale\(([\d.]+) -[\d.]+\)", inner.get("transform") or "")
            if m:
                sizes.append((group.get("id"), float(m.group(1)) * 100))
                break
    return width, sizes


def test_every_plot_has_text_readable_on_a_phone(figures) -> None:
    """At 330 px (a 360 px screen's text column) every text is at least 9 px high."""
    too_small = []
    for name, (_, content) in figures.items():
        width, sizes = svg_text_sizes(content)
        assert sizes, f"{name}: no text found in the SVG"
        smallest = min(pt for _, pt in sizes)
        px = smallest * 330 / width
        if px < MIN_PX:
            too_small.append(f"{name}: {smallest:.1f} pt text in a {width:.0f} pt wide figure is {px:.1f} px")
    assert not too_small, "plot text too small at phone width:\n" + "\n".join(too_small)


def test_no_text_is_cut_off_and_no_legend_covers_data(figures) -> None:
    """Every text lies inside the figure (the JIT page's x label once ended "ticks: every rou"),
    and no legend overlaps a plotting area."""
    problems = []
    for name, (fig, _) in figures.items():
        fig.draw_without_rendering()  # positions at this renderer's dpi
        renderer = fig._get_renderer()
        frame = fig.bbox
        texts = [fig._suptitle, fig._supxlabel, fig._supylabel]
        for ax in fig.axes:
            if not ax.axison:  # a legend's holder: no axes drawn
                continue
            texts += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
            for axis in (ax.xaxis, ax.yaxis):
                for tick in axis._update_ticks():  # the ticks drawn: those inside the view limits
                    texts += [tick.label1, tick.label2]
        for legend in [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends):
            texts += [*legend.get_texts(), legend.get_title()]
        for text in texts:
            if text is None or not text.get_visible() or not text.get_text().strip():
                continue
            box = text.get_window_extent(renderer)
            if box.x0 < frame.x0 - 1 or box.x1 > frame.x1 + 1 or box.y0 < frame.y0 - 1 or box.y1 > frame.y1 + 1:
                problems.append(f"{name}: {text.get_text()[:40]!r} runs outside the figure")
        areas = [ax.patch.get_window_extent(renderer) for ax in fig.axes if not getattr(ax, "legend_holder", False)]
        for legend in [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends):
            box = legend.get_window_extent(renderer)
            for area in areas:
                overlap = min(box.x1, area.x1) - max(box.x0, area.x0), min(box.y1, area.y1) - max(box.y0, area.y0)
                if overlap[0] > 2 and overlap[1] > 2:
                    problems.append(f"{name}: a legend ({legend.get_texts()[0].get_text()[:30]!r}...) covers a plot")
    assert not problems, "\n".join(problems)


def test_every_plot_has_a_transparent_background(figures) -> None:
    for name, (_, content) in figures.items():
        root = ET.fromstring(content)
        patch = next(g for g in root.iter(f"{SVG_NS}g") if g.get("id") == "patch_1")
        style = patch.find(f"{SVG_NS}path").get("style") or ""
        assert re.search(r"fill:\s*none|opacity:\s*0(;|$)", style), f"{name}: the figure background is painted: {style}"


def test_log_axes_label_ticks_as_plain_numbers(figures) -> None:
    """No "3×10⁰" (Matplotlib's default minor-tick labels on a log axis spanning less than a decade)."""
    for name, (fig, _) in figures.items():
        for ax in fig.axes:
            for label in ax.get_xticklabels(which="both") + ax.get_yticklabels(which="both"):
                text = label.get_text()
                m = re.search(r"\\times\s*10\^\{?(-?\d+)", text)
                assert not (m and int(m.group(1)) in (-2, -1, 0, 1, 2, 3, 4)), f"{name}: tick label {text!r}"


def test_series_differ_without_colour(figures) -> None:
    """Within each panel, labelled lines differ in line style or marker, and so do the legend's entries."""
    clashes = []
    for name, (fig, _) in figures.items():
        for ax in fig.axes:
            seen: dict[tuple, str] = {}
            for line in ax.get_lines():
                label = line.get_label()
                if label.startswith("_") or len(line.get_xdata()) < 2 or not line.get_visible():
                    continue
                key = (line.get_linestyle(), str(line.get_marker()))
                if key in seen:
                    clashes.append(f"{name}: {label!r} drawn like {seen[key]!r} {key}")
                seen[key] = label
        for legend in [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends):
            seen = {}
            for handle, text in zip(legend.legend_handles, legend.get_texts()):
                if not hasattr(handle, "get_linestyle") or not hasattr(handle, "get_marker"):
                    continue  # bars and patches: told apart by their position and labels
                key = (handle.get_linestyle(), str(handle.get_marker()))
                if key in seen and key != ("None", "None"):
                    clashes.append(f"{name}: legend entries {seen[key]!r} and {text.get_text()!r} differ by colour only")
                seen[key] = text.get_text()
    assert not clashes, "series told apart by colour alone:\n" + "\n".join(clashes)


def _luminance(rgb) -> float:
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def _contrast(a, b) -> float:
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def _dark_scheme(rgb):
    """CSS ``filter: invert(1) hue-rotate(180deg)`` (Filter Effects 1, the hue-rotate matrix)."""
    r, g, b = (1 - c for c in rgb)
    cos, sin = math.cos(math.pi), math.sin(math.pi)
    m = [[0.213 + cos * 0.787 - sin * 0.213, 0.715 - cos * 0.715 - sin * 0.715, 0.072 - cos * 0.072 + sin * 0.928],
         [0.213 - cos * 0.213 + sin * 0.143, 0.715 + cos * 0.285 + sin * 0.140, 0.072 - cos * 0.072 - sin * 0.283],
         [0.213 - cos * 0.213 - sin * 0.787, 0.715 - cos * 0.715 + sin * 0.715, 0.072 + cos * 0.928 + sin * 0.072]]
    return [min(1.0, max(0.0, row[0] * r + row[1] * g + row[2] * b)) for row in m]


def test_palette_has_contrast_in_both_schemes(figures) -> None:
    from matplotlib.colors import to_rgb

    import plotkit  # on sys.path while the figures fixture ran; cached since

    white, slate = (1, 1, 1), to_rgb("#1e2129")  # Material's slate background
    for colour in plotkit.PALETTE:
        rgb = to_rgb(colour)
        assert _contrast(rgb, white) >= 3.0, f"{colour} has {_contrast(rgb, white):.2f}:1 on white"
        dark = _dark_scheme(rgb)
        assert _contrast(dark, slate) >= 3.0, f"{colour} becomes {dark}, {_contrast(dark, slate):.2f}:1 on slate"
    used = {to_rgb(line.get_color()) for fig, _ in figures.values() for ax in fig.axes for line in ax.get_lines()
            if not line.get_label().startswith("_")}
    allowed = {to_rgb(c) for c in plotkit.PALETTE}
    for rgb in used - allowed:
        grey = max(rgb) - min(rgb) < 0.02
        assert grey and _contrast(rgb, white) >= 2.0, f"series colour {rgb} is outside the palette and not a dark grey"


def test_mixed_precision_figure_shows_the_curves_and_their_difference(figures) -> None:
    fig, _ = figures["training-mixed"]
    panels = [ax for ax in fig.axes if not getattr(ax, "legend_holder", False)]
    assert len(panels) == 3, "underflow, losses, and the difference panel"
    diffs = [line for line in panels[2].get_lines() if not line.get_label().startswith("_")]
    assert len(diffs) == 2, "each mixed-precision run minus float32"
    assert "training-mixed-memory" in figures, "the memory of a mixed-precision step is drawn"


# --------------------------------------------------------------------------- the built site in Chromium


def _pages_with_plots(site: Path) -> list[str]:
    pages = []
    for html in sorted(site.rglob("index.html")):
        if "assets/bench/" in html.read_text(encoding="utf-8"):
            pages.append(html.parent.relative_to(site).as_posix() + "/")
    return pages


@pytest.fixture(scope="module")
def browser():
    sync_playwright = chromium_or_skip()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def _page(browser, base: str, **kw):
    context = browser.new_context(viewport=PHONE, **kw)
    page = context.new_page()
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(base) else r.abort())
    return context, page


def test_plots_fit_a_phone_and_their_text_stays_readable(built_site: Path, site_url: str, browser, figures) -> None:
    smallest_pt = {}
    for name, (_, content) in figures.items():
        width, sizes = svg_text_sizes(content)
        smallest_pt[name] = (min(pt for _, pt in sizes), width)
    pages = _pages_with_plots(built_site)
    assert JIT_PAGE in pages and MIXED_PAGE in pages
    context, page = _page(browser, site_url)
    # The theme's scripts do not size images: skip them (and the images' bytes) to keep this fast.
    page.route(re.compile(r".*\.(js|svg)(\?.*)?$"), lambda r: r.abort())
    problems, seen = [], 0
    for rel in pages:
        # The layout is set once the styles are in (the images are sized by CSS, not by their
        # content); tests/test_site.py checks that every image loads.
        page.goto(f"{site_url}/{rel}", wait_until="domcontentloaded")
        boxes = page.eval_on_selector_all(
            "img[src*='assets/bench/']",
            "imgs => imgs.map(i => ({src: i.getAttribute('src'), w: i.getBoundingClientRect().width,"
            " right: i.getBoundingClientRect().right}))")
        for box in boxes:
            name = Path(box["src"]).stem
            seen += 1
            if box["right"] > PHONE["width"] + 0.5:
                problems.append(f"{rel}: {name} runs off the screen (right edge {box['right']:.0f} px)")
            pt, width = smallest_pt[name]
            px = pt * box["w"] / width
            if px < MIN_PX:
                problems.append(f"{rel}: {name} is {box['w']:.0f} px wide, its {pt:.1f} pt text {px:.1f} px")
    context.close()
    context, page = _page(browser, site_url)
    for rel in (JIT_PAGE, MIXED_PAGE):
        page.goto(f"{site_url}/{rel}", wait_until="load")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.locator("img[src*='assets/bench/']").first.scroll_into_view_if_needed()
        page.screenshot(path=str(ARTIFACTS / f"visuals-phone-{rel.strip('/').replace('/', '-')}.png"))
    context.close()
    assert seen >= 40, f"only {seen} plots found on {len(pages)} pages"
    assert not problems, "\n".join(problems)


def diagram_text(content: bytes) -> tuple[float, float]:
    """(viewBox width, smallest text size) of a diagram: hand-drawn ones set ``font-size``
    (on elements, in ``style`` attributes or in a ``<style>`` sheet); Matplotlib ones draw
    text as paths (``svg_text_sizes``)."""
    root = ET.fromstring(content)
    width = float(root.get("viewBox").replace(",", " ").split()[2])
    sizes = [pt for _, pt in svg_text_sizes(content)[1]]
    for element in root.iter():
        if element.get("font-size"):
            sizes.append(float(element.get("font-size").removesuffix("px")))
        rules = (element.get("style") or "") + (element.text or "" if element.tag == f"{SVG_NS}style" else "")
        sizes += [float(v) for v in re.findall(r"font-size\s*:\s*([\d.]+)", rules)]
    return width, min(sizes)


def test_diagrams_keep_their_text_readable_on_a_phone(built_site: Path, site_url: str, browser) -> None:
    """At 360 px every diagram's smallest text is at least 9 px; a diagram wider than the column
    sits in a box that scrolls sideways, stays on the screen, and can be focused with the keyboard."""
    texts = {svg.name: diagram_text(svg.read_bytes()) for svg in (ROOT / "docs/assets/diagrams").glob("*.svg")}
    pages = sorted({html.parent.relative_to(built_site).as_posix() + "/"
                    for html in built_site.rglob("index.html") if "assets/diagrams/" in html.read_text("utf-8")})
    context, page = _page(browser, site_url)
    # Diagrams are sized by CSS, not by their content: skip the scripts and the images' bytes.
    page.route(re.compile(r".*\.(js|svg)(\?.*)?$"), lambda r: r.abort())
    problems, seen = [], set()
    for rel in pages:
        page.goto(f"{site_url}/{rel}", wait_until="domcontentloaded")
        boxes = page.eval_on_selector_all(
            "img[src*='assets/diagrams/']",
            """imgs => imgs.map(i => { const box = i.closest('.diagram-scroll');
                 const b = box ? box.getBoundingClientRect() : i.getBoundingClientRect();
                 return {src: i.getAttribute('src'), w: i.getBoundingClientRect().width, right: b.right,
                         scrolls: box ? box.scrollWidth > box.clientWidth : false,
                         tabindex: box ? box.getAttribute('tabindex') : null,
                         label: box ? box.getAttribute('aria-label') : null}; })""")
        for box in boxes:
            name = Path(box["src"]).name
            seen.add(name)
            width, smallest = texts[name]
            px = smallest * box["w"] / width
            if px < MIN_PX:
                problems.append(f"{rel}: {name} is {box['w']:.0f} px wide, its {smallest:g}-unit text {px:.1f} px")
            if box["right"] > PHONE["width"] + 0.5:
                problems.append(f"{rel}: {name}'s box runs off the screen (right edge {box['right']:.0f} px)")
            if box["w"] > PHONE["width"] and not (box["scrolls"] and box["tabindex"] == "0" and box["label"]):
                problems.append(f"{rel}: {name} is wider than the screen in a box that cannot be scrolled "
                                f"from the keyboard ({box})")
    context.close()
    context, page = _page(browser, site_url)
    page.goto(f"{site_url}/concepts/allreduce-vs-parameter-servers/", wait_until="load")
    page.locator(".diagram-scroll").first.scroll_into_view_if_needed()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "visuals-phone-diagram-ring-allreduce.png"))
    context.close()
    assert len(seen) >= 30, f"only {len(seen)} diagrams found on {len(pages)} pages"
    assert not problems, "\n".join(problems)

    desktop = browser.new_context(viewport={"width": 1280, "height": 900})
    wide = desktop.new_page()
    wide.goto(f"{site_url}/concepts/allreduce-vs-parameter-servers/", wait_until="load")
    fits = wide.eval_on_selector_all(".diagram-scroll", "bs => bs.map(b => b.scrollWidth <= b.clientWidth)")
    desktop.close()
    assert fits and all(fits), "on a desktop screen a diagram is as wide as the column, with nothing to scroll"


def _figure_filters(page) -> dict[str, str]:
    return page.evaluate(
        "() => Object.fromEntries([...document.querySelectorAll("
        "\"img[src*='assets/bench/'], img[src*='assets/diagrams/']\")]"
        ".map(i => [i.getAttribute('src').split('/').pop(), getComputedStyle(i).filter]))")


def test_dark_scheme_recolours_plots_and_diagrams(site_url: str, browser) -> None:
    """The palette follows the system's scheme (Material's two-scheme palette) and the dark one
    inverts figures with the hue kept; the light one leaves them as drawn."""
    shots = {}
    for scheme in ("light", "dark"):
        context, page = _page(browser, site_url, color_scheme=scheme)
        page.goto(f"{site_url}/{MIXED_PAGE}", wait_until="load")
        assert page.get_attribute("body", "data-md-color-scheme") == ("slate" if scheme == "dark" else "default")
        filters = _figure_filters(page)
        assert any(k.endswith(".svg") and "mixed-precision-step" in k for k in filters), "the diagram is on the page"
        assert any("training-mixed" in k for k in filters), "the plot is on the page"
        shots[scheme] = filters
        page.locator("img[src*='assets/bench/']").first.scroll_into_view_if_needed()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"visuals-phone-{scheme}-mixed-precision.png"))
        context.close()
    assert set(shots["light"].values()) == {"none"}, shots["light"]
    for src, value in shots["dark"].items():
        assert "invert(1)" in value and "hue-rotate(180deg)" in value, f"{src} in the dark scheme: {value}"


def test_fractions_in_tables_are_as_large_as_the_table_text(site_url: str, browser) -> None:
    context, page = _page(browser, site_url)
    page.goto(f"{site_url}/concepts/allreduce-algorithms/", wait_until="load")
    sizes = page.evaluate(
        """() => [...document.querySelectorAll('td .arithmatex mfrac')].map(f => {
             const cell = f.closest('td');
             const parts = [...f.children].map(c => c.getBoundingClientRect().height);
             return {cell: parseFloat(getComputedStyle(cell).fontSize),
                     num: parseFloat(getComputedStyle(f.children[0]).fontSize), parts};
           })""")
    context.close()
    assert sizes, "no fraction in a table on the page"
    for s in sizes:
        assert s["num"] >= s["cell"] - 0.01, f"a table fraction's numerator is {s['num']} px in {s['cell']} px text"


def test_glossary_chinese_is_drawn_with_a_cjk_font(site_url: str, browser) -> None:
    """Two different Han characters drawn with the cell's computed font must differ: with no CJK
    font, Chromium draws both as the same empty box (.notdef)."""
    context, page = _page(browser, site_url)
    page.goto(f"{site_url}/glossary/", wait_until="load")
    result = page.evaluate(
        """() => {
             const span = document.querySelector('td span[lang="zh-Hans"]');
             const style = getComputedStyle(span);
             const draw = ch => {
               const c = document.createElement('canvas'); c.width = 64; c.height = 64;
               const g = c.getContext('2d'); g.font = '40px ' + style.fontFamily;
               g.fillStyle = '#000'; g.fillText(ch, 8, 48);
               return Array.from(g.getImageData(0, 0, 64, 64).data).join(',');
             };
             const text = span.textContent;
             return {family: style.fontFamily, text,
                     differ: draw(text[0]) !== draw(text[1]),
                     width: span.getBoundingClientRect().width, size: parseFloat(style.fontSize)};
           }""")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("td span[lang='zh-Hans']").first.scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "visuals-phone-glossary.png"))
    context.close()
    assert result["family"].startswith('"Noto Sans CJK SC"'), result["family"]
    assert result["differ"], f"{result['text'][:2]!r} draw as the same glyph: no CJK font (install fonts-noto-cjk)"
