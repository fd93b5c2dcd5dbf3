"""The diagrams under docs/assets/diagrams: valid, self-contained, described, used, and not stale.

The site must work offline and with a screen reader, so every SVG parses as XML, has a
viewBox (it scales with the page), a non-empty <title> and <desc>, and refers to nothing
outside itself (no http(s) URL other than the XML namespaces, no href that is not a
``#fragment``, no script). The generated ones (``docs/generators/graph_pictures.py``) must be what
the code draws now, and the numbers their captions state must be the code's.
"""
from __future__ import annotations

import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

import reference_impl.graph as G

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "generators"))
import graph_pictures as draw  # a generator of the site, under docs/generators/

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
DIAGRAMS = ROOT / "docs" / "assets" / "diagrams"
SVG_NS = "{http://www.w3.org/2000/svg}"
SVGS = sorted(DIAGRAMS.glob("*.svg"))
NAMESPACE_DECL = re.compile(r'xmlns(?::\w+)?="[^"]*"')


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def test_there_are_diagrams():
    assert len(SVGS) >= 20, [p.name for p in SVGS]


@pytest.mark.parametrize("path", SVGS, ids=lambda p: p.name)
def test_svg_parses_scales_and_is_described(path: Path):
    root = ET.fromstring(path.read_bytes())
    assert root.tag == f"{SVG_NS}svg", f"{path.name}: root element is {root.tag}, not an SVG <svg>"
    box = root.get("viewBox", "").split()
    assert len(box) == 4 and all(float(v) >= 0 for v in box) and float(box[2]) > 0 and float(box[3]) > 0, \
        f"{path.name}: needs a viewBox 'x y width height', got {root.get('viewBox')!r}"
    for name in ("title", "desc"):
        element = root.find(f"{SVG_NS}{name}")  # a direct child: the accessible name and description
        assert element is not None and "".join(element.itertext()).strip(), \
            f"{path.name}: needs a non-empty <{name}> as a child of <svg>"


@pytest.mark.parametrize("path", SVGS, ids=lambda p: p.name)
def test_svg_refers_to_nothing_outside_itself(path: Path):
    text = path.read_text(encoding="utf-8")
    assert "<!DOCTYPE" not in text, f"{path.name}: a DOCTYPE names an external DTD"
    urls = re.findall(r"https?://[^\s\"'<>)]*", NAMESPACE_DECL.sub("", text))
    assert not urls, f"{path.name}: external URLs {urls}"
    for element in ET.fromstring(text.encode()).iter():
        tag = _local(element.tag)
        assert tag not in ("script", "foreignObject", "image", "iframe"), f"{path.name}: has a <{tag}>"
        for attr, value in element.attrib.items():
            if _local(attr) == "href":
                assert value.startswith("#"), f"{path.name}: <{tag} href={value!r}> leaves the file"
            if _local(attr).startswith("on"):
                raise AssertionError(f"{path.name}: <{tag}> has an event handler {attr}")
            for ref in re.findall(r"url\(([^)]*)\)", value):
                assert ref.strip("'\" ").startswith("#"), f"{path.name}: url({ref}) leaves the file"
        if tag == "style":
            for ref in re.findall(r"url\(([^)]*)\)|@import", element.text or ""):
                assert ref.strip("'\" ").startswith("#"), f"{path.name}: a stylesheet imports or loads {ref!r}"


def test_every_diagram_is_shown_on_a_page():
    pages = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs").rglob("*.md"))
    unused = [p.name for p in SVGS if f"assets/diagrams/{p.name}" not in pages]
    assert not unused, f"diagrams no page shows: {unused}"


def test_the_generated_diagrams_are_what_the_code_draws():
    """Regenerate with ``python docs/generators/graph_pictures.py`` after changing the drawing code."""
    for name, text in draw.pictures().items():
        assert (DIAGRAMS / name).read_text(encoding="utf-8") == text, \
            f"{name} is out of date: run python docs/generators/graph_pictures.py"


def _caption(page: str, svg: str) -> str:
    text = (ROOT / "docs" / "concepts" / page).read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if f"(../assets/diagrams/{svg})" in line]
    assert len(lines) == 1, f"{page} should show {svg} once"
    return lines[0]


def test_the_gradient_picture_draws_exactly_the_ops_gradients_adds():
    loss, xs, grad_ops, grads = draw.autodiff_example()
    root = ET.fromstring((DIAGRAMS / "autodiff-gradient-graph.svg").read_bytes())
    boxes = {}  # op name -> (stroke, dashed) of its box
    for g in root.iter(f"{SVG_NS}g"):
        title, rect = g.find(f"{SVG_NS}title"), g.find(f"{SVG_NS}rect")
        boxes[title.text.split(" (")[0]] = (rect.get("stroke"), rect.get("stroke-dasharray") is not None)
    # the dashed ones are those no requested gradient needs: recomputed here by walking back from grads
    needed, stack = set(), [g.op for g in grads]
    while stack:
        op = stack.pop()
        if op in grad_ops and op not in needed:
            needed.add(op)
            stack.extend(t.op for t in op.inputs)
    forward = ["x", "w", "b", "matmul", "add", "tanh", "loss"]
    assert boxes == {**{name: (draw.FORWARD[1], False) for name in forward},
                     **{op.name: (draw.GRADIENT[1], op not in needed) for op in grad_ops}}
    assert sorted(op.name for op in grad_ops if op not in needed) == ["MatMul", "Transpose"]  # dL/dx: unasked
    caption = _caption("autodiff.md", "autodiff-gradient-graph.svg")
    assert f"{len(grad_ops)} ops" in caption and f"{len(needed)} of them" in caption, caption
    # and what it draws is right: the gradients match central differences
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    with G.Session(loss.graph) as sess:
        sess.run(G.global_variables_initializer(loss.graph))
        feed = {loss.graph.get_tensor_by_name("x:0"): x}
        gw, gb = sess.run(grads, feed)
        w, b = sess.run(xs)

    def f(w_: np.ndarray, b_: np.ndarray) -> float:
        return float(np.tanh(x.astype(np.float64) @ w_ + b_).sum())

    def central(v: np.ndarray, at: tuple, other: np.ndarray, first: bool, eps: float = 1e-6) -> float:
        up, down = v.copy(), v.copy()
        up[at] += eps
        down[at] -= eps
        fu, fd = (f(up, other), f(down, other)) if first else (f(other, up), f(other, down))
        return (fu - fd) / (2 * eps)

    w64, b64 = w.astype(np.float64), b.astype(np.float64)
    num_w = np.array([[central(w64, (i, j), b64, True) for j in range(w.shape[1])] for i in range(w.shape[0])])
    num_b = np.array([central(b64, (j,), w64, False) for j in range(b.size)])
    np.testing.assert_allclose(gw, num_w, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gb, num_b, rtol=1e-4, atol=1e-4)


def test_the_passes_picture_uses_the_session_passes_and_its_caption_has_their_counts():
    before = draw.passes_example()
    after, fates, report = draw.pass_fates(before, ["y"], draw.SESSION_PASSES)
    _, session_report = G.optimize(draw.passes_example(), ["y"])  # the default list Session runs
    assert [(n, a, b) for n, a, b in report] == session_report
    assert [(a, b) for _, a, b in report] == [(11, 10), (10, 6), (6, 6), (6, 4)]  # the page's table
    assert sorted(op.type for op in after.operations) == ["Add", "Const", "Mul", "Placeholder"]
    assert fates == {"spare": (0, "removed"),                                    # pruning
                     **{n: (1, "removed") for n in ("Const_2", "Const_3", "Mul_2", "Mul_3")},  # CSE
                     "Mul": (2, "rewritten"),                                     # folded to 6.0
                     "Const": (3, "removed"), "Const_1": (3, "removed")}          # then unused
    caption = _caption("graph-optimisation.md", "graph-optimisation-passes.svg")
    assert f"{len(before)} ops" in caption and f"{len(after)} ops" in caption, caption
    svg = (DIAGRAMS / "graph-optimisation-passes.svg").read_text(encoding="utf-8")
    for name, a, b in report:
        assert f"({a}→{b} ops)" in svg and name.replace("_", " ") in svg



def _svg_text(name: str) -> str:
    root = ET.fromstring((DIAGRAMS / name).read_bytes())
    return "\n".join("".join(t.itertext()) for t in root.iter(f"{SVG_NS}text"))


def test_the_jit_diagram_states_the_op_counts_the_compiler_reports():
    from reference_impl.compiler import optimize_for_inference

    g = G.Graph()
    with g.as_default():  # the model of docs/generators/jit_example.py (counts do not depend on values)
        x = G.placeholder("float32", (None, 4), name="x")
        w1, b1, w2 = G.Variable(np.ones((4, 3), np.float32)), G.Variable(np.ones(3, np.float32)), \
            G.Variable(np.ones((3, 2), np.float32))
        y = G.matmul(G.relu(G.matmul(x, w1) + b1), w2, name="logits")
        sess = G.Session(g)
        sess.run(G.global_variables_initializer())
    graph, report = optimize_for_inference(sess, [y])
    (_, total, frozen), *passes = report
    text = _svg_text("jit-compilation.svg")
    assert f"{total} ops (with initialisers)" in text and f"{total} → {frozen} ops" in text, report
    assert f"{frozen} → {len(graph)} ops" in text and passes[-1] == ("elementwise_fusion", frozen, len(graph))
    assert [op.type for op in graph.operations].count("FusedElementwise") == 1  # "Add + Relu become one"


def test_the_quantisation_diagram_shows_what_quantize_per_channel_computes():
    from reference_impl.quantize import QMAX, quantize_per_channel

    w = np.array([[2.54, 0.05], [-1.27, -0.02], [0.6, 0.031], [-2.0, -0.05]], np.float32)
    q, scales = quantize_per_channel(w)
    one_scale = np.abs(w).max() / QMAX
    q_one = np.clip(np.rint(w / one_scale), -QMAX, QMAX).astype(int)
    desc = ET.fromstring((DIAGRAMS / "quantisation.svg").read_bytes()).find(f"{SVG_NS}desc").text
    assert f"s = {one_scale:.2f}" in desc and f"{q_one[:, 1].tolist()}, only {len(range(-2, 3))} levels" in desc
    assert q_one[:, 1].min() == -2 and q_one[:, 1].max() == 2
    assert f"column 1 becomes {q[:, 1].astype(int).tolist()}" in desc
    text = _svg_text("quantisation.svg")
    for column in q.T.tolist() + q_one.T.tolist():
        assert all(str(v) in text for v in column)
    assert f"s₁ = {scales[1]:.7f}" in text


def test_the_feature_column_diagram_shows_the_ids_the_columns_compute():
    import reference_impl.models.feature_columns as fc

    f = {"age": np.array([37.5]), "dept": np.array(["physics"]), "user": np.array(["u_83211"]),
         "item": np.array(["lecture_17"])}
    age = fc.numeric_column("age", mean=40.0, std=12.0)
    user = fc.categorical_column_with_hash_bucket("user", 100_000)
    item = fc.categorical_column_with_hash_bucket("item", 1_000)
    text = _svg_text("feature-columns.svg")
    assert f"{age.dense(f)[0, 0]:.3f}" in text
    assert f"id {fc.bucketized_column(age, [18, 25, 35, 50]).ids(f)[0]} of 5" in text
    assert f"id {fc.categorical_column_with_vocabulary_list('dept', ['maths', 'physics', 'history']).ids(f)[0]} of 4" in text
    assert f"id {user.ids(f)[0]}" in text and f"({user.ids(f)[0]}, {item.ids(f)[0]})" in text
    assert f"id {fc.crossed_column([user, item], 1_000_000).ids(f)[0]}" in text
    assert str(fc.dynamic_categorical_column("user").ids(f)[0]) in text


def test_the_consistency_timelines_are_what_the_simulator_does_without_jitter(monkeypatch):
    from reference_impl.models import ClickLog, HashedLogReg
    from reference_impl.ps import consistency

    def exact(rng, n, straggler, slowdown, straggle_prob=0.0):  # the diagram's times: 1 unit, worker 0 takes 3
        return np.where(np.arange(n) == straggler, slowdown, 1.0)

    monkeypatch.setattr(consistency, "step_times", exact)
    problem = HashedLogReg(n_buckets=64, n_train=256, n_test=64, log=ClickLog(vocab_size=50))

    def run(model: str, **kw):
        return consistency.simulate(model, problem, horizon=9.0, straggler=0, slowdown=3.0, **kw)

    bsp, asp, ssp = run("bsp", n_workers=4), run("asp", n_workers=4), run("ssp", n_workers=4, staleness=1)
    backup = run("backup", n_workers=3, backups=1)
    assert len(bsp.used) == 3 and all(len(u) == 4 for u in bsp.used)
    assert len(asp.staleness) == 30 and sorted(asp.staleness)[-3:] == [6, 9, 9]  # worker 0's three pushes
    assert len(ssp.staleness) == 15
    assert len(backup.used) == 9 and all(u == [1, 2, 3] for u in backup.used) and backup.dropped == 9
    text = _svg_text("consistency-models.svg")
    for said in ("3 updates (4 gradients each)", "30 updates, nobody waits", "6–9 updates", "15 updates",
                 "9 updates (3 gradients each)", "dropped every round"):
        assert said in text, said
