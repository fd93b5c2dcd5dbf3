"""The cache of generated assignments (grader/generated.py) and its use by ``grader.steps``.

What is checked:

* a gradebook restored from the cache and given a run's token is, cell for cell (text and
  nbgrader checksum), the gradebook that generating with that token gives, and the release
  has the same cell texts; the cache entry holds the token slot and neither run's token;
* the key changes with every input of generation (a source file, the configuration), and
  not with anything else;
* a gradebook cell whose checksum does not match its text is refused, not personalised;
* storing is atomic (no staging folder is left, a second store of a key keeps the first)
  and old entries are pruned;
* ``grader check`` through the cache: the first run stores, the next one uses the entry and
  scores the same, and a learner cell that lists the cache folder finds it empty (hidden
  from the kernel); ``LAB_GRADER_CACHE=off`` stores nothing.
"""
from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import ROOT
from notebook_tools import Started, grader_env, read_nb, source_of, write_nb

from grader import generated
from grader.guard import instrument

ASSIGNMENT = "01_tiny"
CONFIG = (ROOT / "exercises" / "nbgrader_config.py").read_text()

pytestmark = pytest.mark.timeout(180)


def _code(grade_id: str, source: str, *, points: int | None = None, solution: bool = False) -> dict:
    meta = {"grade": points is not None, "grade_id": grade_id, "locked": not solution, "schema_version": 3,
            "solution": solution, "task": False}
    if points is not None:
        meta["points"] = points
    return {"cell_type": "code", "execution_count": None, "metadata": {"nbgrader": meta}, "outputs": [],
            "source": source}


def tiny_notebook() -> dict:
    """One solution, one visible and one hidden test (1 + 2 points)."""
    return {
        "nbformat": 4, "nbformat_minor": 5,
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                     "language_info": {"name": "python"}, "lab": {"assignment": ASSIGNMENT}},
        "cells": [
            _code("solution", "def add(a, b):\n    ### BEGIN SOLUTION\n    return a + b\n    ### END SOLUTION\n",
                  solution=True),
            _code("test_add", "assert add(2, 3) == 5, 'add(2, 3) should be 5'", points=1),
            _code("hidden_add", "### BEGIN HIDDEN TESTS\nassert add(-1, 7) == 6, 'add(-1, 7) should be 6'\n"
                  "### END HIDDEN TESTS\n", points=2),
        ],
    }


def make_course(folder: Path, token: str) -> Path:
    """A course at ``folder/course`` whose one source notebook is instrumented with ``token``."""
    root = folder / "course"
    (root / "source" / ASSIGNMENT).mkdir(parents=True)
    (root / "nbgrader_config.py").write_text(CONFIG)
    write_nb(root / "source" / ASSIGNMENT / "tiny.ipynb", instrument(tiny_notebook(), token))
    return root


def start_generate(root: Path, *, token: str | None, cache: Path | None) -> subprocess.Popen:
    argv = [sys.executable, "-m", "grader.steps", str(root), "--assignment", ASSIGNMENT, "--steps", "generate",
            "--result", str(root.parent / "steps.json")] + (["--cache", str(cache)] if cache else [])
    env = grader_env(**({"LAB_GUARD_TOKEN": token} if token else {}))
    return subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, root: Path, *, ok: bool = True) -> dict:
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode == 0) == ok, err[-3000:]
    return json.loads((root.parent / "steps.json").read_text())


def source_cells(db: Path) -> list[tuple]:
    with sqlite3.connect(db) as connection:
        return connection.execute(
            "SELECT name, cell_type, locked, source, checksum FROM source_cell ORDER BY name").fetchall()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """A first run that stores, generation with the token itself, a run that restores, and a
    run that restores from a copy of the cache whose entry has a checksum changed."""
    work = tmp_path_factory.mktemp("cache")
    cache, bad_cache = work / "cache", work / "bad-cache"
    roots = {name: make_course(work / name, "b" * 32 if name == "direct" else generated.TOKEN_SLOT)
             for name in ("first", "direct", "second", "bad")}
    started = {"first": start_generate(roots["first"], token="a" * 32, cache=cache),
               "direct": start_generate(roots["direct"], token=None, cache=None)}
    records = {name: finish(proc, roots[name]) for name, proc in started.items()}
    shutil.copytree(cache, bad_cache)
    entry = next(bad_cache.iterdir())
    with sqlite3.connect(entry / generated.GRADEBOOK) as connection:
        connection.execute("UPDATE source_cell SET checksum = 'x' WHERE name = 'hidden_add'")
    started = {"second": start_generate(roots["second"], token="b" * 32, cache=cache),
               "bad": start_generate(roots["bad"], token="b" * 32, cache=bad_cache)}
    records["second"] = finish(started["second"], roots["second"])
    records["bad"] = finish(started["bad"], roots["bad"], ok=False)
    return {"cache": cache, "records": records, "roots": roots}


def test_a_restored_gradebook_is_the_one_generating_with_the_token_gives(runs):
    records, roots = runs["records"], runs["roots"]
    assert records["first"]["generated"] == "generated, and stored in the cache"
    assert records["second"]["generated"] == "from the cache"
    restored = source_cells(roots["second"] / "gradebook.db")
    fresh = source_cells(roots["direct"] / "gradebook.db")
    assert restored == fresh
    assert sum("b" * 32 in row[3] for row in restored) == 2  # both test cells carry the token
    released = read_nb(roots["second"] / "release" / ASSIGNMENT / "tiny.ipynb")
    direct = read_nb(roots["direct"] / "release" / ASSIGNMENT / "tiny.ipynb")
    # the same cells (their text: the release's checksums are of the slot, and are not used)
    assert [source_of(c).replace(generated.TOKEN_SLOT, "b" * 32) for c in released["cells"]] == [
        source_of(c) for c in direct["cells"]]


def test_the_cache_holds_the_slot_and_no_token(runs):
    entries = [p for p in runs["cache"].iterdir()]
    assert len(entries) == 1 and not entries[0].name.startswith(".")
    assert runs["cache"].stat().st_mode & 0o777 == 0o700
    cells = source_cells(entries[0] / generated.GRADEBOOK)
    texts = " ".join(row[3] for row in cells)
    assert texts.count(repr(generated.TOKEN_SLOT)) == 2
    assert "a" * 32 not in texts and "b" * 32 not in texts
    assert not re.search(r"'[0-9a-f]{32}'", texts)


def test_a_cell_whose_checksum_does_not_match_is_refused(runs):
    failed = runs["records"]["bad"]["failed"]
    assert failed["step"] == "generate"
    assert failed["message"].startswith("PersonaliseError: gradebook cell hidden_add of tiny: its checksum")
    assert not (runs["roots"]["bad"] / "autograded").exists()


def test_the_key_follows_every_input_of_generation(tmp_path):
    one = make_course(tmp_path / "one", generated.TOKEN_SLOT)
    two = make_course(tmp_path / "two", generated.TOKEN_SLOT)
    key = generated.source_key(one, ASSIGNMENT)
    assert generated.source_key(two, ASSIGNMENT) == key  # same inputs, another folder
    (two / "source" / ASSIGNMENT / "data.csv").write_text("1,2\n")
    assert generated.source_key(two, ASSIGNMENT) != key  # any file of the assignment counts
    (two / "source" / ASSIGNMENT / "data.csv").unlink()
    (two / "nbgrader_config.py").write_text(CONFIG + "\nc.ExecutePreprocessor.timeout = 61\n")
    assert generated.source_key(two, ASSIGNMENT) != key
    (two / "nbgrader_config.py").write_text(CONFIG)
    notebook = two / "source" / ASSIGNMENT / "tiny.ipynb"
    write_nb(notebook, instrument(tiny_notebook(), "d" * 32))
    assert generated.source_key(two, ASSIGNMENT) != key


def test_storing_is_atomic_and_old_entries_go(tmp_path, monkeypatch):
    root = tmp_path / "course"
    (root / "release" / ASSIGNMENT).mkdir(parents=True)
    (root / "release" / ASSIGNMENT / "tiny.ipynb").write_text("{}")
    cache = tmp_path / "cache"
    (root / generated.GRADEBOOK).write_text("first")
    generated.store(cache, "k0", root, ASSIGNMENT)
    (root / generated.GRADEBOOK).write_text("second")
    generated.store(cache, "k0", root, ASSIGNMENT)  # a racing run: the first entry stays whole
    assert (cache / "k0" / generated.GRADEBOOK).read_text() == "first"
    assert sorted(p.name for p in cache.iterdir()) == ["k0"]  # no staging folder left
    monkeypatch.setattr(generated, "KEEP_ENTRIES", 2)
    for key in ("k1", "k2"):
        generated.store(cache, key, root, ASSIGNMENT)
    assert len(list(cache.iterdir())) == 2 and (cache / "k2").is_dir()
    target = tmp_path / "restored"
    (target / "release").mkdir(parents=True)
    assert generated.restore(cache, "k2", target, ASSIGNMENT)
    assert not generated.restore(cache, "missing", target, ASSIGNMENT)
    # an entry that cannot be copied whole (here: the release is already there) is not half-used
    assert not generated.restore(cache, "k2", target, ASSIGNMENT)
    assert not (target / generated.GRADEBOOK).exists()


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() != 0,
                    reason="check caches only when the kernel runs as a user of its own (root)")
def test_check_uses_the_cache_and_scores_the_same(tmp_path):
    # the cache in a folder the kernel's user could enter: only the jail's hiding keeps it out
    base = Path(tempfile.mkdtemp(prefix="lab-cache-test-"))
    base.chmod(0o755)
    try:
        _check_through_the_cache(tmp_path, base / "cache")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _check_through_the_cache(tmp_path: Path, cache: Path) -> None:
    course = tmp_path / "course"
    (course / "source" / ASSIGNMENT).mkdir(parents=True)
    (course / "nbgrader_config.py").write_text(CONFIG)
    write_nb(course / "source" / ASSIGNMENT / "tiny.ipynb", tiny_notebook())
    notebook = write_nb(tmp_path / "tiny.ipynb", tiny_notebook())

    def check(name: str, where: str, notebook: Path = notebook) -> Started:
        return Started("--course", str(course), "check", str(notebook), "--json", "--feedback-dir",
                       str(tmp_path / f"fb-{name}"), cwd=tmp_path, env=grader_env(LAB_GRADER_CACHE=where))

    # a learner cell looking into the cache finds an empty folder (the jail's tmpfs over it) or,
    # behind bubblewrap, no folder at all; without that it would get a PermissionError (the cache
    # is private to root), not the entries
    snooping = tiny_notebook()
    snooping["cells"].insert(1, {
        "cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
        "source": f"import os\ntry:\n    found = os.listdir({str(cache)!r})\nexcept OSError as exc:\n"
                  "    found = type(exc).__name__\nraise RuntimeError(f'cache seen: {found}')\n"})
    snooper = write_nb(tmp_path / "snooper" / "tiny.ipynb", snooping)

    first = check("first", str(cache)).wait().result()
    assert first["steps"]["generated"] == "generated, and stored in the cache"
    assert len(list(cache.iterdir())) == 1
    entry = next(cache.iterdir())
    again, off = check("again", str(cache), snooper), check("off", "off")
    again, off = again.wait().result(), off.wait().result()
    for result in (first, again, off):
        assert (result["score"], result["max_score"], result["error"]) == (3.0, 3.0, None)
    assert again["steps"]["generated"] == "from the cache"
    assert [e["error"] for e in again["cell_errors"]] in (["RuntimeError: cache seen: []"],
                                                          ["RuntimeError: cache seen: FileNotFoundError"])
    assert off["steps"]["generated"] == "generated"
    assert [p for p in cache.iterdir()] == [entry]
