"""The small model whose generated C the "JIT compilation" page shows.

``python docs/generators/jit_example.py`` rewrites ``docs/assets/generated/jit_example.c``;
``tests/test_compiler.py`` fails if the committed file differs from what the generator
produces now, so the page always shows the code this compiler really emits.

The model: ``relu(x @ W1 + b1) @ W2`` with a dense 4×3 ``W1`` and a pruned 3×2 ``W2`` (half its
weights zero), so one listing shows a pre-packed dense loop, a fused bias+ReLU loop and an
unrolled sparse layer whose weights are literals in the code. A generator of the site, not
part of the compiler: it lives under ``docs/generators/``.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import reference_impl.graph as G

from reference_impl.compiler.c_codegen import generate_c
from reference_impl.compiler.jit import optimize_for_inference

OUT = Path(__file__).resolve().parents[1] / "assets" / "generated" / "jit_example.c"


def example_source() -> str:
    w1 = np.array([[0.5, -1.0, 0.25], [1.5, 0.0, -0.75], [-0.5, 2.0, 1.0], [0.125, -0.25, 0.5]], np.float32)
    b1 = np.array([0.1, -0.2, 0.3], np.float32)
    w2 = np.array([[0.0, 1.25], [-2.0, 0.0], [0.0, 0.5]], np.float32)
    g = G.Graph()
    with g.as_default():
        x = G.placeholder("float32", (None, 4), name="x")
        v1, vb, v2 = G.Variable(w1, name="W1"), G.Variable(b1, name="b1"), G.Variable(w2, name="W2")
        y = G.matmul(G.relu(G.matmul(x, v1) + vb), v2, name="logits")
        sess = G.Session(g)
        sess.run(G.global_variables_initializer())
    graph, _ = optimize_for_inference(sess, [y])
    source, _ = generate_c(graph, ["x"], [y.name], "auto")
    return source


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(example_source(), encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
