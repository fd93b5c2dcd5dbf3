"""Draw a graph, or its partitions, as SVG: the pictures on the partitioning page come from here.

``draw_graph(graph)`` lays out one graph in layers (an op's layer is the length of the
longest path from a source to it, so every edge points down), one column block per device,
each op coloured by its device.  ``draw_partitions(parts)`` draws each partition in its own
box, ``_Send``/``_Recv`` ops in grey, and a dashed arrow from every ``_Send`` to its ``_Recv``.

``python -m reference_impl.graph.draw`` writes the page's two pictures, built from
``example_graph()`` by the real ``prune``, ``place`` and ``partition``;
tests/test_graph_partition.py checks that the committed files are what this writes.
"""
from __future__ import annotations

from html import escape
from pathlib import Path

from .core import Graph, Operation
from .partition import partition, prune
from .placement import DeviceSpec, place

BOX_W, BOX_H, COL_W, ROW_H, PAD = 132, 34, 146, 62, 16
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


def _node(op: Operation, x: float, y: float, fill: str, stroke: str) -> str:
    name = op.name if len(op.name) <= 19 else op.name[:18] + "…"
    return (f'<g><title>{escape(op.name)} ({op.type}) on {escape(op.device or "no device")}</title>'
            f'<rect x="{x - BOX_W / 2:.0f}" y="{y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="5" '
            f'fill="{fill}" stroke="{stroke}"/>'
            f'<text x="{x:.0f}" y="{y + 14:.0f}" text-anchor="middle" font-size="11">{escape(name)}</text>'
            f'<text x="{x:.0f}" y="{y + 27:.0f}" text-anchor="middle" font-size="9" fill="#555">{op.type}</text></g>')


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


def _svg(width: float, height: float, title: str, body: list[str]) -> str:
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'font-family="sans-serif" font-size="12">',
        f"<title>{escape(title)}</title>",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#777"/></marker></defs>',
        *body, "</svg>", ""])


def draw_graph(graph: Graph, title: str = "a placed graph") -> str:
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
    return _svg(max(width + 2 * PAD, 150 * len(devices) + PAD), legend_y + 30, title, body)


def draw_partitions(parts: dict[str, Graph], title: str = "the partitions") -> str:
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
    for (d, _), (op, (x1, y1)) in positions.items():
        if op.type == "_Send":
            x2, y2 = recvs[(op.attrs["tensor_name"], op.attrs["recv_device"])]
            body.append(f'<path d="M{x1:.0f},{y1 + BOX_H:.0f} C{x1:.0f},{y1 + BOX_H + 40:.0f} {x2:.0f},'
                        f'{y2 - 40:.0f} {x2:.0f},{y2 - 2:.0f}" fill="none" stroke="#c62828" '
                        f'stroke-dasharray="6 4" marker-end="url(#arrow)"/>')
    return _svg(x - 24 + PAD, top + max(heights) + PAD, title, body)


def example_graph() -> tuple[Graph, list[str], list[str]]:
    """The page's example: w on the ps, a tower per worker, the towers' sum back on the ps.

    Returns the graph, the fetches and the targets of the step that is drawn.
    """
    from . import ops as G
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


def write_pictures(folder: Path) -> list[Path]:
    """Write partition-before.svg and partition-after.svg for ``example_graph`` into ``folder``."""
    g, fetches, targets = example_graph()
    placed = place(prune(g, fetches, targets))
    files = {
        "partition-before.svg": draw_graph(placed, "after pruning and placement: one graph, ops coloured by device"),
        "partition-after.svg": draw_partitions(partition(placed), "after partitioning: one graph per device, "
                                               "a _Send/_Recv pair per cut edge"),
    }
    out = []
    for name, text in files.items():
        path = folder / name
        path.write_text(text, encoding="utf-8")
        out.append(path)
    return out


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[2]
    for p in write_pictures(root / "docs" / "assets" / "diagrams"):
        print(f"wrote {p.relative_to(root)}")
