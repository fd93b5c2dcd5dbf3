"""Figures quoted in prose agree on every page, and with their source.

Benchmark figures are checked against the JSON they come from (``page_tools.assert_pages_quote``).
This module does the same for quantities that pages state in prose, often on several pages:
link rates of InfiniBand generations, NVLink bandwidth, default bucket and fusion sizes,
floating-point limits, the latencies of the simulated interconnect profiles, and every
conversion or approximation a page writes out (``100 Gb/s ≈ 12.5 GB/s``, ``2^{-10} ≈ 9.8e-4``).

Each fact has the expected value from its primary source (a standard, a file in a named
repository, NumPy, the lab's own code) and regular expressions that find where a page states
it. Every mention on every page (as rendered, includes expanded) must carry the expected
value, and every pattern must find at least one mention, so a rephrased page cannot slip
past a pattern that no longer matches anything.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache

import numpy as np
import pytest
from page_tools import DOCS, rendered_markdown

from reference_impl.comm.simnet import INTERCONNECTS, TCP_LATENCY_S

SUPERSCRIPT = str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789")
NUMBER = r"\d+(?:\.\d+)?"


@cache
def pages() -> dict[str, str]:
    """Every page of the site as a reader sees it, with line breaks and TeX spacing folded."""
    out = {}
    for page in sorted(DOCS.rglob("*.md")):
        if {"hooks", "answers"} & set(page.relative_to(DOCS).parts):
            continue
        text = rendered_markdown(page)
        text = text.replace("\\,", " ").replace("\\;", " ").replace("$", "")
        out[str(page.relative_to(DOCS))] = " ".join(text.split())
    return out


def mentions(pattern: str) -> list[tuple[str, re.Match]]:
    compiled = re.compile(pattern)
    return [(name, m) for name, text in pages().items() for m in compiled.finditer(text)]


def context(name: str, match: re.Match) -> str:
    text = pages()[name]
    return f"{name}: …{text[max(0, match.start() - 40):match.end() + 20]}…"


@dataclass(frozen=True)
class Fact:
    """A quantity, its expected value(s) by key, its source, and the phrasings that state it."""
    name: str
    expected: dict[str, float]  # key (a generation, a format …) -> value; "" when there is one value
    source: str
    patterns: tuple[str, ...]   # each with a group "v" (the value) and, when keyed, a group "k"


# Sources: IEEE Std 802.3bs-2017 (200/400 Gb/s Ethernet) and 802.3df-2024 (800 Gb/s); the
# InfiniBand Trade Association's roadmap (data rate of a 4x port: EDR 100, HDR 200, NDR 400,
# XDR 800 Gb/s); NVIDIA H100 Tensor Core GPU datasheet (NVLink 900 GB/s per GPU); NVIDIA A100
# Tensor Core GPU datasheet (third-generation NVLink, 600 GB/s per GPU);
# pytorch/pytorch v2.5.1 torch/nn/parallel/distributed.py (bucket_cap_mb = 25);
# horovod/horovod v0.28.1 horovod/common/operations.cc (fusion threshold 128 MiB, cycle 1 ms);
# numpy.finfo(numpy.float16); reference_impl/comm/simnet.py (the simulated profiles).
IB_PORT_GBPS = {"EDR": 100, "HDR": 200, "NDR": 400, "XDR": 800}
GEN = r"(?P<k>EDR|HDR|NDR|XDR)"
FACTS = [
    Fact("InfiniBand 4x port rate (Gb/s)", IB_PORT_GBPS, "IBTA roadmap", (
        rf"\b{GEN} (?:= )?(?P<v>\d+) Gb/s",
        rf"\b{GEN}(?: InfiniBand)? and (?P<v>\d+) ?Gb(?:E| Ethernet)\b",
        rf"\b{GEN} \(\d+ Gb/s per lane\) \| (?P<v>\d+) Gb/s",
    )),
    Fact("InfiniBand lane rate x 4 (Gb/s)", IB_PORT_GBPS, "IBTA roadmap", (
        rf"\b{GEN} \((?P<lane>\d+) Gb/s per lane\)",
    )),
    Fact("NVLink bandwidth of an H100, both directions (GB/s)", {"": 900}, "H100 datasheet", (
        r"NVLink[^.|]{0,60}? (?P<v>\d+) GB/s(?! per A100)",
        r"(?P<v>\d+) GB/s (?:of NVLink|per H100|per GPU counting)",
    )),
    Fact("PyTorch DDP bucket_cap_mb default (MiB)", {"": 25}, "torch/nn/parallel/distributed.py", (
        r"DDP's (?:default is )?(?P<v>\d+) MiB",
        r"`bucket_cap_mb` defaults to (?P<v>\d+)",
    )),
    Fact("Horovod fusion threshold default since v0.21 (MiB)", {"": 128}, "horovod/common/operations.cc", (
        r"up to (?P<v>\d+) MiB \(`HOROVOD_FUSION_THRESHOLD`",
    )),
    Fact("Horovod cycle time default (ms)", {"": 1}, "horovod/common/operations.cc", (
        r"`HOROVOD_CYCLE_TIME`, (?P<v>\d+) ms",
    )),
    Fact("float16 largest finite value", {"": float(np.finfo(np.float16).max)}, "numpy.finfo(numpy.float16)", (
        r"(?:float16|half)[^.]{0,80}?largest (?:finite )?value (?:of )?(?P<v>\d[\d ]*\d)",
    )),
    Fact("one-way latency of the simulated TCP profiles (µs)", {"": TCP_LATENCY_S * 1e6},
         "reference_impl/comm/simnet.py", (
             r"(?:GbE|Gb Ethernet|Gb/s Ethernet)(?: with|, | over) TCP \(alpha (?P<v>\d+) microseconds",
             r"(?:GbE|Gb/s Ethernet)(?:,| over) TCP \((?:α|\\alpha) (?:=|≈) (?P<v>\d+) µs",
             r"(?P<v>\d+) µs for kernel TCP",
         )),
    Fact("one-way latency of the simulated InfiniBand profiles (µs)",
         {"": INTERCONNECTS["IB-NDR"].latency_s * 1e6}, "reference_impl/comm/simnet.py", (
             r"(?P<v>\d+(?:\.\d+)?) µs for InfiniBand",
         )),
    Fact("NVLink bandwidth of an A100, both directions (GB/s)", {"": 600}, "A100 datasheet", (
        r"(?P<v>\d+) GB/s per A100",
    )),
]


def _value(text: str) -> float:
    return float(text.replace(" ", ""))


@pytest.mark.parametrize("fact", FACTS, ids=lambda f: f.name)
def test_every_mention_of_a_fact_has_its_sourced_value(fact: Fact) -> None:
    wrong, found = [], 0
    for pattern in fact.patterns:
        hits = mentions(pattern)
        assert hits, f"{fact.name}: the pattern {pattern!r} matches no page any more; update it"
        for name, m in hits:
            found += 1
            key = m.groupdict().get("k") or ""
            want = fact.expected[key]
            got = _value(m.group("lane")) * 4 if "lane" in m.groupdict() else _value(m.group("v"))
            if not math.isclose(got, want, rel_tol=1e-9):
                wrong.append(f"{context(name, m)} says {got:g}, {fact.source} says {want:g}")
    assert found and not wrong, f"{fact.name}:\n" + "\n".join(wrong)


# --------------------------------------------------------------------------- written-out arithmetic


def _agrees(written: str, exact: float) -> bool:
    """``written`` (e.g. '9.8', '6.1e-5') equals ``exact`` rounded to the digits written."""
    value = float(written)
    decimals = len(written.split("e")[0].partition(".")[2])
    exponent = int(written.split("e")[1]) if "e" in written else 0
    step = 10.0 ** (exponent - decimals)
    return abs(value - exact) <= step / 2 * (1 + 1e-9)


def _mantissa_exp(m: re.Match) -> str:
    mant, exp = m.group("m"), m.group("e")
    return mant if exp is None else f"{mant}e{exp.translate(SUPERSCRIPT)}"


SCIENTIFIC = (rf"(?P<m>{NUMBER})(?:\s*(?:\\times|×)\s*10(?:\^\{{(?P<e>-?\d+)\}}|(?P<e2>[⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+)))?")


def _scientific(m: re.Match) -> str:
    exp = m.group("e") or (m.group("e2").translate(SUPERSCRIPT) if m.group("e2") else None)
    return m.group("m") if exp is None else f"{m.group('m')}e{exp}"


def test_powers_of_two_written_out_are_right() -> None:
    """``2^{-10} ≈ 9.8×10^{-4}``, ``2⁻²⁴ ≈ 6.0 × 10⁻⁸``: the decimal matches to the digits shown."""
    pattern = (r"(?<!\+ )(?<!\d)2(?:\^\{(?P<p>-?\d+)\}|(?P<p2>[⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+))\s*(?:\\approx|≈|=)\s*"
               + SCIENTIFIC)
    hits = mentions(pattern)
    assert len(hits) >= 5, f"expected the float-format pages to write out powers of two, found {len(hits)}"
    wrong = []
    for name, m in hits:
        power = int(m.group("p") or m.group("p2").translate(SUPERSCRIPT))
        written = _scientific(m)
        if not _agrees(written, 2.0 ** power):
            wrong.append(f"{context(name, m)}: 2^{power} = {2.0 ** power:.4g}, not {written}")
    assert not wrong, "\n".join(wrong)


def test_link_rates_converted_to_bytes_are_right() -> None:
    """``100 Gb/s ≈ 12.5 GB/s``, ``400 Gb/s is 50 GB/s``: bits to bytes is a factor of 8."""
    pattern = (rf"(?P<bits>{NUMBER}) Gb/s(?: link)?(?: \(B =|(?: \\approx| ≈| =| is| moves at most)) "
               rf"(?P<bytes>{NUMBER}) GB/s")
    hits = mentions(pattern)
    assert len(hits) >= 3, f"expected pages to convert link rates to bytes, found {len(hits)}"
    wrong = [f"{context(name, m)}: {m.group('bits')} Gb/s is {float(m.group('bits')) / 8:g} GB/s"
             for name, m in hits if not math.isclose(float(m.group("bits")) / 8, float(m.group("bytes")))]
    assert not wrong, "\n".join(wrong)


def test_the_fact_patterns_find_what_they_should() -> None:
    """The patterns recognise the phrasings the pages use (and a wrong figure in them)."""
    sample = {"x.md": "NDR InfiniBand and 400GbE at 400 Gb/s; HDR (50 Gb/s per lane) | 200 Gb/s; "
                      "NDR 300 Gb/s per port; PyTorch DDP's default is 25 MiB; "
                      "2^{-10} \\approx 9.8\\times 10^{-4}; 2⁻²⁴ ≈ 6.0 × 10⁻⁸; 100 Gb/s ≈ 12.5 GB/s"}
    found = {}
    for fact in FACTS[:4]:
        for pattern in fact.patterns:
            for m in re.finditer(pattern, sample["x.md"]):
                found.setdefault(fact.name, []).append(m.group("lane") if "lane" in m.groupdict() else m.group("v"))
    assert found["InfiniBand 4x port rate (Gb/s)"] == ["300", "400", "200"]
    assert found["InfiniBand lane rate x 4 (Gb/s)"] == ["50"]
    assert found["PyTorch DDP bucket_cap_mb default (MiB)"] == ["25"]
    assert _agrees("9.8e-4", 2 ** -10) and _agrees("6.0e-8", 2 ** -24) and not _agrees("6.1e-8", 2 ** -24)
