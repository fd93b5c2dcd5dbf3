"""``python -m grader check NOTEBOOK --watch``: grade again every time the notebook is saved.

Polling the file's modification time (and size) is portable and needs no extra package;
at a poll interval of half a second a save is noticed well before the learner has switched
windows. A save is only acted on once the file has stopped changing for one interval, so
an editor writing the file in several steps triggers one grading run, not several.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

DEFAULT_POLL = 0.5


def _stamp(path: Path) -> tuple[int, int] | None:
    """(mtime in ns, size), or None while the file does not exist (an editor mid-save)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size


def wait_for_change(path: Path, *, poll: float = DEFAULT_POLL,
                    sleep: Callable[[float], None] = time.sleep) -> None:
    """Return once ``path`` has been saved again and has then stayed the same for one poll."""
    before = _stamp(path)
    while True:
        sleep(poll)
        now = _stamp(path)
        if now is not None and now != before:
            sleep(poll)
            if _stamp(path) == now:
                return
            before = None  # still being written: wait for it to settle


def watch(path: Path, grade: Callable[[], None], *, max_runs: int | None = None,
          poll: float = DEFAULT_POLL, announce: Callable[[str], None] = print) -> int:
    """Call ``grade()`` now and after every save of ``path``; stop after ``max_runs`` calls.

    ``max_runs`` None watches until interrupted (Ctrl-C). Returns the number of runs.
    """
    runs = 0
    while True:
        grade()
        runs += 1
        if max_runs is not None and runs >= max_runs:
            return runs
        announce(f"watching {path} for changes (Ctrl-C to stop)")
        wait_for_change(path, poll=poll)
