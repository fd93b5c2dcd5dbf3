"""Draw a graph as SVG: the generated pictures on the concept pages come from here.

A generator of the site, not part of the runtime: it lives under ``docs/generators/``.

``draw_graph(graph)`` lays out one graph in layers (an op's layer is the length of the
longest path from a source to it, so every edge points down), one column block per device,
each op coloured by its device.  ``draw_partitions(parts)`` draws each partition in its own
box, ``_Send``/``_Recv`` ops in grey, and a dashed arrow from every ``_Send`` to its ``_Recv``.
``draw_gradients`` draws a forward graph going down and the ops ``gradients`` added going
back up beside it; ``draw_before_after`` draws a graph before and after a list of passes,
each op of the first coloured by the pass that removed or rewrote it.

``python docs/generators/graph_pictures.py`` writes every picture (``write_pictures``), each
built by the real ``prune``/``place``/``partition``, ``gradients`` or passes from a small
example in this module; tests/test_diagrams.py checks that the committed files are what
this writes.
"""
from __future__ import annotations

from collections.abc import Callable
from html import escape
from pathlib import Path

from reference_impl.graph import (
    DeviceSpec,
    Graph,
    Operation,
    Tensor,
    common_subexpression_elimination,
    constant_folding,
    dead_node_removal,
    gradients,
    partition,
    place,
    prune,
)

BOX_W, BOX_H, COL_W, ROW_H, PAD = 116, 34, 126, 62, 16
COLOURS = ["#e3f2fd", "#e8f5e9", "#fff3e0", "#f3e5f5", "#e0f7fa"]
STROKES = ["#1565c0", "#2e7d32", "#e65100", "#6a1b9a", "#00838f"]
EXCHANGE = ("#eeeeee", "#616161")


def _layers(graphs: list[Graph]) -> dict[Operation, int]:
    """Each op's layer: the longest path to it, counting a ``_Send`` → ``_Recv`` hop as an edge."""
    depth: dict[Operation, int] = {}
    sends = {(op.attrs["tensor_name"], op.attrs["recv_device"]): op
             for g in graphs for op in g.operations if op.type == "_Send"}
    ops = [op for g in graphs for op in g.operations]
    while len(depth) < len(ops):  # each partition is topological, a _Recv waits for its _Send
        for op in ops:
            if op in depth:
                continue
            preds = [t.op for t in op.inputs] + list(op.control_inputs)
            if op.type == "_Recv":
                preds.append(sends[(op.attrs["tensor_name"], op.attrs["recv_device"])])
            if all(p in depth for p in preds):
                depth[op] = 1 + max((depth[p] for p in preds), default=-1)
    return depth


def _label(device: str) -> str:
    return DeviceSpec.parse(device).short if device else "unplaced"


def _layout(graph: Graph, x0: float, y0: float,
            depth: dict[Operation, int]) -> tuple[dict[Operation, tuple[float, float]], float, float]:
    """Positions (centre x, top y) of each op of ``graph``, and the block's width and height."""
    rows: dict[int, list[Operation]] = {}
    for op in graph.operations:
        rows.setdefault(depth[op], []).append(op)
    width = max(len(r) for r in rows.values()) * COL_W if rows else COL_W
    pos = {}
    for d, ops in rows.items():
        start = x0 + (width - len(ops) * COL_W) / 2
        for i, op in enumerate(ops):
            pos[op] = (start + i * COL_W + COL_W / 2, y0 + d * ROW_H)
    return pos, width, (max(depth.values(), default=0) + 1) * ROW_H


def _detail(op: Operation) -> str:
    """The small second line of a box: the op type, a constant's value, a fused op's steps."""
    if op.type == "Const":
        value = op.attrs["value"]
        return f"Const {float(value):g}" if value.ndim == 0 else "Const " + "×".join(map(str, value.shape))
    if op.type == "FusedElementwise":
        return "fused " + "→".join(step[0] for step in op.attrs["program"])
    return op.type


def _node(op: Operation, x: float, y: float, fill: str, stroke: str, dashed: bool = False,
          detail: str | None = None) -> str:
    name = op.name if len(op.name) <= 17 else op.name[:16] + "…"
    dash = ' stroke-dasharray="5 3"' if dashed else ""
    return (f'<g><title>{escape(op.name)} ({op.type}) on {escape(op.device or "no device")}</title>'
            f'<rect x="{x - BOX_W / 2:.0f}" y="{y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="5" '
            f'fill="{fill}" stroke="{stroke}"{dash}/>'
            f'<text x="{x:.0f}" y="{y + 14:.0f}" text-anchor="middle" font-size="11">{escape(name)}</text>'
            f'<text x="{x:.0f}" y="{y + 27:.0f}" text-anchor="middle" font-size="9" fill="#555">'
            f'{escape(detail or _detail(op))}</text></g>')


def _edges(graph: Graph, pos: dict) -> list[str]:
    out = []
    for op in graph.operations:
        x2, y2 = pos[op]
        for src, dashed in [(t.op, False) for t in op.inputs] + [(c, True) for c in op.control_inputs]:
            x1, y1 = pos[src]
            dash = ' stroke-dasharray="2 3"' if dashed else ""
            if y2 - y1 > 1.5 * ROW_H:  # skips a layer: bend around the boxes in between
                bend = max(x1, x2) + BOX_W * 0.6
                out.append(f'<path d="M{x1 + BOX_W / 2:.0f},{y1 + BOX_H / 2:.0f} C{bend:.0f},{y1 + BOX_H / 2:.0f} '
                           f'{bend:.0f},{y2 + BOX_H / 2:.0f} {x2 + BOX_W / 2 + 2:.0f},{y2 + BOX_H / 2:.0f}" '
                           f'fill="none" stroke="#777"{dash} marker-end="url(#arrow)"/>')
                continue
            out.append(f'<line x1="{x1:.0f}" y1="{y1 + BOX_H:.0f}" x2="{x2:.0f}" y2="{y2 - 2:.0f}" '
                       f'stroke="#777"{dash} marker-end="url(#arrow)"/>')
    return out


MARKERS = {"arrow": "#777", "arrow-grad": "#e8590c", "arrow-read": "#1971c2"}


def _svg(width: float, height: float, title: str, body: list[str], desc: str = "") -> str:
    """The document: a <title> and a <desc> (what a screen reader says), a white background."""
    markers = "".join(
        f'<marker id="{name}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        f'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="{colour}"/></marker>'
        for name, colour in MARKERS.items())
    root = (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" '
            f'width="{width:.0f}" height="{height:.0f}" role="img" aria-labelledby="title desc" '
            f'font-family="system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif" font-size="12">')
    return "\n".join([
        root,
        f'<title id="title">{escape(title)}</title>',
        f'<desc id="desc">{escape(desc or title)}</desc>',
        f"<defs>{markers}</defs>",
        f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
        *body, "</svg>", ""])


def draw_graph(graph: Graph, title: str = "a placed graph", desc: str = "") -> str:
    """One graph, ops coloured by device, with a legend."""
    devices = sorted({op.device for op in graph.operations})
    colour = {d: i % len(COLOURS) for i, d in enumerate(devices)}
    pos, width, height = _layout(graph, PAD, PAD + 28, _layers([graph]))
    body = [f'<text x="{PAD}" y="{PAD + 8}" font-weight="bold">{escape(title)}</text>']
    body += _edges(graph, pos)
    body += [_node(op, *pos[op], COLOURS[colour[op.device]], STROKES[colour[op.device]]) for op in graph.operations]
    legend_y = PAD + 28 + height + 6
    for i, d in enumerate(devices):
        x = PAD + i * 150
        body.append(f'<rect x="{x}" y="{legend_y}" width="14" height="14" fill="{COLOURS[colour[d]]}" '
                    f'stroke="{STROKES[colour[d]]}"/><text x="{x + 20}" y="{legend_y + 12}">{_label(d)}</text>')
    return _svg(max(width + 2 * PAD, 150 * len(devices) + PAD), legend_y + 30, title, body, desc)


def draw_partitions(parts: dict[str, Graph], title: str = "the partitions", desc: str = "") -> str:
    """Each partition in a box; dashed arrows from each ``_Send`` to its ``_Recv``."""
    body = [f'<text x="{PAD}" y="{PAD + 8}" font-weight="bold">{escape(title)}</text>']
    x, top, heights, positions = PAD, PAD + 28, [], {}
    depth = _layers(list(parts.values()))
    for i, (device, g) in enumerate(sorted(parts.items())):
        pos, width, height = _layout(g, x + PAD, top + 30, depth)
        c, spec = i % len(COLOURS), DeviceSpec.parse(device)
        body.append(f'<rect x="{x}" y="{top}" width="{width + 2 * PAD}" height="{height + 40}" rx="8" '
                    f'fill="none" stroke="{STROKES[c]}"/>'
                    f'<text x="{x + 10}" y="{top + 18}" font-weight="bold" fill="{STROKES[c]}">'
                    f'/job:{spec.job}/task:{spec.task}</text>')
        body += _edges(g, pos)
        for op in g.operations:
            fill, stroke = EXCHANGE if op.type in ("_Send", "_Recv") else (COLOURS[c], STROKES[c])
            body.append(_node(op, *pos[op], fill, stroke))
            positions[(device, op.name)] = (op, pos[op])
        heights.append(height + 40)
        x += width + 2 * PAD + 24
    recvs = {(op.attrs["tensor_name"], op.attrs["recv_device"]): p
             for (d, _), (op, p) in positions.items() if op.type == "_Recv"}
    for op, (x1, y1) in positions.values():
        if op.type == "_Send":
            x2, y2 = recvs[(op.attrs["tensor_name"], op.attrs["recv_device"])]
            body.append(f'<path d="M{x1:.0f},{y1 + BOX_H:.0f} C{x1:.0f},{y1 + BOX_H + 40:.0f} {x2:.0f},'
                        f'{y2 - 40:.0f} {x2:.0f},{y2 - 2:.0f}" fill="none" stroke="#c62828" '
                        f'stroke-dasharray="6 4" marker-end="url(#arrow)"/>')
    return _svg(x - 24 + PAD, top + max(heights) + PAD, title, body, desc)


def example_graph() -> tuple[Graph, list[str], list[str]]:
    """The page's example: w on the ps, a tower per worker, the towers' sum back on the ps.

    Returns the graph, the fetches and the targets of the step that is drawn.
    """
    import reference_impl.graph as G
    g = Graph()
    with g.as_default():
        with g.device("/job:ps/task:0"):
            w = G.Variable([[0.5, -1.0], [2.0, 1.0]], name="w")
        losses = []
        for k in range(2):
            with g.device(f"/job:worker/task:{k}"):
                x = G.placeholder("float32", [None, 2], name=f"x{k}")
                h = G.relu(G.matmul(x, w, name=f"matmul{k}"), name=f"relu{k}")
                losses.append(G.reduce_sum(h, name=f"loss{k}"))
        G.placeholder("float32", [None, 2], name="unused")  # nobody needs it: pruned
        with g.device("/job:ps/task:0"):
            total = G.add(losses[0], losses[1], name="total")
        with g.device("/job:worker/task:0"):
            step = G.group(total, name="step_done")
    return g, [total.name], [step.name]


FORWARD = ("#e7f5ff", "#1971c2")
GRADIENT = ("#fff4e6", "#e8590c")
Box = tuple[float, float]  # a box's centre x and top y


def _connect(a: Box, b: Box, stroke: str = "#777", marker: str = "arrow", dashed: bool = False) -> str:
    """An arrow from box ``a`` to box ``b``: sideways within a row, else top or bottom edge to edge."""
    (x1, y1), (x2, y2) = a, b
    dash = ' stroke-dasharray="4 3"' if dashed else ""
    style = f'fill="none" stroke="{stroke}"{dash} marker-end="url(#{marker})"'
    if abs(y1 - y2) < 1:
        side = 1 if x2 > x1 else -1
        return (f'<line x1="{x1 + side * BOX_W / 2:.0f}" y1="{y1 + BOX_H / 2:.0f}" '
                f'x2="{x2 - side * (BOX_W / 2 + 2):.0f}" y2="{y2 + BOX_H / 2:.0f}" {style}/>')
    down = y2 > y1
    sy, ey = (y1 + BOX_H, y2 - 2) if down else (y1, y2 + BOX_H + 2)
    if abs(y2 - y1) > 1.5 * ROW_H:  # skips a row: bow out sideways past the boxes in between
        bend = max(x1, x2) + BOX_W * 0.7
        return (f'<path d="M{x1 + BOX_W / 2:.0f},{y1 + BOX_H / 2:.0f} C{bend:.0f},{y1 + BOX_H / 2:.0f} '
                f'{bend:.0f},{y2 + BOX_H / 2:.0f} {x2 + BOX_W / 2 + 2:.0f},{y2 + BOX_H / 2:.0f}" {style}/>')
    return f'<line x1="{x1:.0f}" y1="{sy:.0f}" x2="{x2:.0f}" y2="{ey:.0f}" {style}/>'


def _longest_path(ops: list[Operation]) -> dict[Operation, int]:
    """Each op's layer among ``ops`` (in topological order), counting only edges inside ``ops``."""
    inside, depth = set(ops), {}
    for op in ops:
        preds = [t.op for t in op.inputs if t.op in inside] + [c for c in op.control_inputs if c in inside]
        depth[op] = 1 + max((depth[p] for p in preds), default=-1)
    return depth


def _sink_sources(ops: list[Operation], depth: dict[Operation, int]) -> None:
    """Move each op with no input among ``ops`` down to just above its first consumer."""
    inside = set(ops)
    for op in ops:
        if not any(t.op in inside for t in op.inputs):
            readers = [depth[c] for c in ops if any(t.op is op for t in c.inputs)]
            if readers:
                depth[op] = min(readers) - 1


def _place_rows(rows: dict[int, list[Operation]], x0: float, y_of: Callable[[int], float],
                width: float) -> dict[Operation, Box]:
    """Centre each row's ops in a block ``width`` wide starting at ``x0``."""
    pos = {}
    for row, ops in rows.items():
        start = x0 + (width - len(ops) * COL_W) / 2
        for i, op in enumerate(ops):
            pos[op] = (start + i * COL_W + COL_W / 2, y_of(row))
    return pos


def _barycentre(op: Operation, pos: dict[Operation, Box]) -> float:
    """The mean x of the placed ops ``op`` reads from or is read by."""
    xs = [pos[t.op][0] for t in op.inputs if t.op in pos]
    xs += [pos[c][0] for c in pos if any(t.op is op for t in c.inputs)]
    return sum(xs) / len(xs) if xs else pos[op][0]


def _untangle(rows: dict[int, list[Operation]], fixed: dict[Operation, Box],
              place: Callable[[dict[int, list[Operation]]], dict[Operation, Box]]) -> dict[Operation, Box]:
    """Order each row by the mean x of its ops' neighbours (the barycentre heuristic), a few sweeps."""
    pos = {**fixed, **place(rows)}
    for _ in range(4):
        for ops in rows.values():
            ops.sort(key=lambda op, pos=pos: _barycentre(op, pos))
        pos = {**fixed, **place(rows)}
    return pos


def _ancestors(tensors: list[Tensor]) -> set[Operation]:
    """Every op ``tensors`` depend on through data edges, their own ops included."""
    seen, stack = set(), [t.op for t in tensors]
    while stack:
        op = stack.pop()
        if op not in seen:
            seen.add(op)
            stack.extend(t.op for t in op.inputs)
    return seen


def _legend(x: float, y: float, items: list[tuple[str, str, str, bool]]) -> list[str]:
    """One row of (fill, stroke, label, dashed) swatches."""
    out = []
    for fill, stroke, label, dashed in items:
        dash = ' stroke-dasharray="4 2"' if dashed else ""
        out.append(f'<rect x="{x:.0f}" y="{y:.0f}" width="14" height="14" rx="2" fill="{fill}" stroke="{stroke}"{dash}/>'
                   f'<text x="{x + 20:.0f}" y="{y + 12:.0f}" font-size="11">{escape(label)}</text>')
        x += 34 + 6.2 * len(label)
    return out


def draw_gradients(loss: Tensor, xs: list[Tensor], grad_ops: list[Operation], grads: list[Tensor],
                   title: str, desc: str = "") -> str:
    """The forward graph of ``loss`` going down on the left; ``grad_ops`` going back up on the right.

    ``grads`` are what ``gradients(loss, xs)`` returned.  Forward ops are blue, the ops
    ``gradients`` added orange; an orange op none of ``grads`` needs is dashed (``Session``
    prunes it); a dashed blue arrow is a forward value the backward pass reads, which is why
    activations stay in memory until it has run.
    """
    upstream = _ancestors([loss])
    forward = [op for op in loss.graph.operations if op in upstream]  # no initialisers
    needed = _ancestors(grads)
    f_depth = _longest_path(forward)
    g_depth = _longest_path(grad_ops)
    _sink_sources(forward, f_depth)
    _sink_sources(grad_ops, g_depth)
    inside = set(grad_ops)
    base = max(max(f_depth.values()), max(g_depth.values()))
    top = PAD + 48

    def row_y(r: int) -> float:
        return top + r * ROW_H

    f_rows: dict[int, list[Operation]] = {}
    for op in forward:
        f_rows.setdefault(f_depth[op], []).append(op)
    g_rows: dict[int, list[Operation]] = {}
    for op in grad_ops:
        g_rows.setdefault(base - g_depth[op], []).append(op)
    f_width = max(len(r) for r in f_rows.values()) * COL_W
    g_width = max(len(r) for r in g_rows.values()) * COL_W
    gap = 56
    pos = _place_rows(f_rows, PAD, row_y, f_width)
    place_g = lambda rows: _place_rows(rows, PAD + f_width + gap, row_y, g_width)  # noqa: E731
    pos = _untangle(g_rows, pos, place_g)
    for r, ops in g_rows.items():  # ops reading a forward value of their own row go first, nearest
        def reach(op: Operation, r: int = r) -> float:  # source first, so at most the others need an arc
            xs = [pos[t.op][0] for t in op.inputs if t.op in f_rows.get(r, [])]
            return -max(xs) if xs else float("inf")
        ops.sort(key=reach)
    pos.update(place_g(g_rows))
    width = PAD + f_width + gap + g_width + PAD
    body = [f'<text x="{PAD}" y="{PAD + 8}" font-weight="bold">{escape(title)}</text>',
            (f'<text x="{PAD + f_width / 2:.0f}" y="{top - 12}" text-anchor="middle" font-weight="600" '
             f'fill="{FORWARD[1]}">forward graph (runs top to bottom)</text>'),
            (f'<text x="{PAD + f_width + gap + g_width / 2:.0f}" y="{top - 12}" text-anchor="middle" '
             f'font-weight="600" fill="{GRADIENT[1]}">ops gradients() added (run bottom to top)</text>')]
    for op in forward:
        body += [_connect(pos[t.op], pos[op]) for t in op.inputs]
    for op in grad_ops:
        for t in op.inputs:
            if t.op in inside:
                body.append(_connect(pos[t.op], pos[op], GRADIENT[1], "arrow-grad"))
            elif pos[t.op][1] == pos[op][1] and any(pos[t.op][0] < pos[o][0] < pos[op][0]
                                                    for o in pos if pos[o][1] == pos[op][1]):
                (x1, y1), (x2, y2) = pos[t.op], pos[op]  # boxes in between: arc in from above
                body.append(f'<path d="M{x1 + 20:.0f},{y1:.0f} C{x1 + 20:.0f},{y1 - 36:.0f} {x2 - 20:.0f},'
                            f'{y2 - 36:.0f} {x2 - 20:.0f},{y2 - 2:.0f}" fill="none" '
                            f'stroke="{FORWARD[1]}" stroke-dasharray="4 3" marker-end="url(#arrow-read)"/>')
            else:
                body.append(_connect(pos[t.op], pos[op], FORWARD[1], "arrow-read", dashed=True))
    body += [_node(op, *pos[op], *FORWARD) for op in forward]
    names = {g.op: f"= ∂{loss.op.name}/∂{x.op.name}" for g, x in zip(grads, xs) if g is not None}
    body += [_node(op, *pos[op], *GRADIENT, dashed=op not in needed, detail=names.get(op)) for op in grad_ops]
    legend_y = top + base * ROW_H + BOX_H + 20
    body += _legend(PAD, legend_y, [
        (*FORWARD, "forward op", False), (*GRADIENT, "gradient op", False),
        (*GRADIENT, "gradient op no requested gradient needs", True)])
    body.append(f'<line x1="{PAD}" y1="{legend_y + 32}" x2="{PAD + 30}" y2="{legend_y + 32}" stroke="{FORWARD[1]}" '
                f'stroke-dasharray="4 3" marker-end="url(#arrow-read)"/><text x="{PAD + 38}" y="{legend_y + 36}" '
                f'font-size="11">a forward value the backward pass reads (kept in memory until then)</text>')
    return _svg(width, legend_y + 50, title, body, desc)


PassFn = Callable[[Graph, list[str]], Graph]
#: fill and stroke of the ops each pass removes or rewrites, in the order the passes run
PASS_COLOURS = [("#f1f3f5", "#868e96"), ("#f3f0ff", "#7048e8"), ("#ebfbee", "#2f9e44"), ("#fff4e6", "#e8590c"),
                ("#e3fafc", "#0c8599"), ("#fff0f6", "#c2255c")]


def pass_fates(graph: Graph, keep: list[str], passes: list[tuple[str, PassFn]]
               ) -> tuple[Graph, dict[str, tuple[int, str]], list[tuple[str, int, int]]]:
    """Run ``passes`` one at a time and record which one removed (``"removed"``) or replaced
    (``"rewritten"``: same name, new type) each op, by name, as (pass index, what)."""
    fates: dict[str, tuple[int, str]] = {}
    report = []
    for i, (name, fn) in enumerate(passes):
        after = fn(graph, keep)
        types = {op.name: op.type for op in after.operations}
        for op in graph.operations:
            if op.name not in types:
                fates[op.name] = (i, "removed")
            elif types[op.name] != op.type:
                fates[op.name] = (i, "rewritten")
        report.append((name, len(graph), len(after)))
        graph = after
    return graph, fates, report


def _rows_of(graph: Graph) -> dict[int, list[Operation]]:
    """Longest-path rows, sources moved down to their first consumer, unused sources at the bottom."""
    ops = list(graph.operations)
    depth = _longest_path(ops)
    _sink_sources(ops, depth)
    used = {t.op for op in ops for t in op.inputs} | {c for op in ops for c in op.control_inputs}
    bottom = max(depth.values())
    rows: dict[int, list[Operation]] = {}
    for op in ops:
        row = bottom if (op not in used and not op.inputs and depth[op] == 0) else depth[op]
        rows.setdefault(row, []).append(op)
    return rows


def draw_before_after(before: Graph, after: Graph, fates: dict[str, tuple[int, str]],
                      report: list[tuple[str, int, int]], title: str, desc: str = "") -> str:
    """``before`` with each op coloured by the pass that removed (dashed) or rewrote it, and ``after``."""
    b_rows, a_rows = _rows_of(before), _rows_of(after)
    b_width = max(len(r) for r in b_rows.values()) * COL_W
    a_width = max(len(r) for r in a_rows.values()) * COL_W
    gap, top = 70, PAD + 48

    def row_y(r: int) -> float:
        return top + r * ROW_H

    pos = _place_rows(b_rows, PAD, row_y, b_width)
    a_pos = _place_rows(a_rows, PAD + b_width + gap, row_y, a_width)
    body = [f'<text x="{PAD}" y="{PAD + 8}" font-weight="bold">{escape(title)}</text>',
            (f'<text x="{PAD + b_width / 2:.0f}" y="{top - 12}" text-anchor="middle" font-weight="600">'
             f'before: {len(before)} ops</text>'),
            (f'<text x="{PAD + b_width + gap + a_width / 2:.0f}" y="{top - 12}" text-anchor="middle" '
             f'font-weight="600">after: {len(after)} ops</text>')]
    for graph, p in ((before, pos), (after, a_pos)):
        for op in graph.operations:
            for k, t in enumerate(op.inputs):
                twins = [u for u in op.inputs if u.op is t.op]
                if len(twins) == 1:
                    body.append(_connect(p[t.op], p[op]))
                    continue
                shift = 8 * (op.inputs[:k + 1].count(t) - (len(twins) + 1) / 2)  # one arrow per use
                (x1, y1), (x2, y2) = p[t.op], p[op]
                body.append(_connect((x1 + shift, y1), (x2 + shift, y2)))
    for op in before.operations:
        i, what = fates.get(op.name, (None, "kept"))
        fill, stroke = FORWARD if i is None else PASS_COLOURS[i % len(PASS_COLOURS)]
        body.append(_node(op, *pos[op], fill, stroke, dashed=what == "removed"))
    for op in after.operations:
        i, what = fates.get(op.name, (None, "kept"))
        fill, stroke = FORWARD if i is None else PASS_COLOURS[i % len(PASS_COLOURS)]
        body.append(_node(op, *a_pos[op], fill, stroke))
    mid_y = top + (max(b_rows) * ROW_H + BOX_H) / 2
    body.append(f'<line x1="{PAD + b_width + 8}" y1="{mid_y:.0f}" x2="{PAD + b_width + gap - 8}" y2="{mid_y:.0f}" '
                f'stroke="#333" stroke-width="2" marker-end="url(#arrow)"/>')
    legend_y = top + max(b_rows) * ROW_H + BOX_H + 22
    items = [(*FORWARD, "kept unchanged", False)]
    for i, (name, n_before, n_after) in enumerate(report):
        counts = {what: sum(1 for f in fates.values() if f == (i, what)) for what in ("removed", "rewritten")}
        said = ", ".join(f"{what} {n}" for what, n in counts.items() if n) or "no change"
        fill, stroke = PASS_COLOURS[i % len(PASS_COLOURS)]
        items.append((fill, stroke, f"{name.replace('_', ' ')}: {said} ({n_before}→{n_after} ops)",
                      counts["removed"] > 0))
    for k, item in enumerate(items):  # one pass a line: the counts are the point
        body += _legend(PAD + (k % 2) * (b_width + gap + a_width) / 2, legend_y + (k // 2) * 22, [item])
    height = legend_y + ((len(items) + 1) // 2) * 22 + 6
    return _svg(PAD + b_width + gap + a_width + PAD, height, title, body, desc)


def autodiff_example() -> tuple[Tensor, list[Tensor], list[Operation], list[Tensor]]:
    """The autodiff page's model, ``loss = sum(tanh(x @ w + b))``, and ``gradients(loss, [w, b])``.

    Returns the loss, the xs, the ops ``gradients`` added and the gradients it returned.
    """
    import reference_impl.graph as G
    g = Graph()
    with g.as_default():
        x = G.placeholder("float32", [None, 3], name="x")
        w = G.Variable([[0.5, -1.0], [2.0, 1.0], [0.25, -0.5]], name="w")
        b = G.Variable([0.1, -0.2], name="b")
        loss = G.reduce_sum(G.tanh(G.add(G.matmul(x, w, name="matmul"), b, name="add"), name="tanh"), name="loss")
        first = len(g.operations)
        grads = gradients(loss, [w, b])
    return loss, [w, b], g.operations[first:], grads


#: what ``Session`` runs on a new signature, in order (``optimize``'s default; a test checks they agree)
SESSION_PASSES: list[tuple[str, PassFn]] = [
    ("prune", dead_node_removal), ("common_subexpression_elimination", common_subexpression_elimination),
    ("constant_folding", constant_folding), ("dead_node_removal", dead_node_removal)]


def passes_example() -> Graph:
    """The graph-optimisation page's graph: ``x * (2 * 3)`` written twice, and an unused placeholder."""
    import reference_impl.graph as G
    g = Graph()
    with g.as_default():
        x = G.placeholder("float64", [2])
        G.add(x * (G.constant(2.0, dtype="float64") * G.constant(3.0, dtype="float64")),
              x * (G.constant(2.0, dtype="float64") * G.constant(3.0, dtype="float64")), name="y")
        G.placeholder("float64", [2], name="spare")
    return g


def pictures() -> dict[str, str]:
    """Every generated picture, by file name."""
    g, fetches, targets = example_graph()
    placed = place(prune(g, fetches, targets))
    loss, xs, grad_ops, grads = autodiff_example()
    needed = len(_ancestors(grads) & set(grad_ops))
    before = passes_example()
    after, fates, report = pass_fates(before, ["y"], SESSION_PASSES)
    steps = "; ".join(f"{name.replace('_', ' ')} {a} to {b}" for name, a, b in report)
    return {
        "partition-before.svg": draw_graph(
            placed, "after pruning and placement: one graph, ops coloured by device",
            "The example graph after pruning and placement: w and total on the parameter server ps:0, "
            "x0, matmul0, relu0, loss0 and step_done on worker:0, x1, matmul1, relu1 and loss1 on worker:1."),
        "partition-after.svg": draw_partitions(
            partition(placed), "after partitioning: one graph per device, a _Send/_Recv pair per cut edge",
            "The same graph cut into one graph per device. Every edge that crossed devices is replaced by a "
            "_Send on the producer's device and a _Recv on the consumer's, joined by a dashed arrow: w to "
            "each worker, loss0 and loss1 to the ps, and a control pair from total to step_done."),
        "autodiff-gradient-graph.svg": draw_gradients(
            loss, xs, grad_ops, grads, "loss = sum(tanh(x @ w + b)) and the ops gradients(loss, [w, b]) adds",
            f"Left, the forward graph: x and w feed matmul, b is added, then tanh and the sum loss. Right, "
            f"the {len(grad_ops)} ops gradients added, walking back up from loss: OnesLike seeds the gradient 1, "
            f"BroadcastLike spreads it to tanh's shape, Mul by 1 minus tanh squared gives the gradient of add, "
            f"SumToShapeOf undoes the broadcast of b, and MatMul with the transpose of x gives the gradient of w. "
            f"Dashed blue arrows are forward values the backward pass reads. The MatMul with the transpose of w "
            f"computes the gradient of x, which nobody asked for: only {needed} of the {len(grad_ops)} ops are "
            f"needed for the two requested gradients, and a Session run prunes the rest."),
        "graph-optimisation-passes.svg": draw_before_after(
            before, after, fates, report, "x * (2 * 3) written twice, before and after the Session's passes",
            f"Before, {len(before)} ops: a placeholder, four constants, four multiplications, the addition y "
            f"and an unused placeholder spare. Each op is coloured by the pass that removes or rewrites it "
            f"({steps}). After, {len(after)} ops: Placeholder, the folded constant 6, one Mul, and y "
            f"adding that Mul to itself."),
    }


def write_pictures(folder: Path) -> list[Path]:
    """Write every picture of ``pictures()`` into ``folder``."""
    out = []
    for name, text in pictures().items():
        path = folder / name
        path.write_text(text, encoding="utf-8")
        out.append(path)
    return out


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[2]  # docs/generators/ -> the repository
    for p in write_pictures(root / "docs" / "assets" / "diagrams"):
        print(f"wrote {p.relative_to(root)}")
