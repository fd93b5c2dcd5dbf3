"""Running commands as an ordinary user, in a checkout that user owns.

Learners run the lab on their own machines as ordinary users; the suite (and CI) runs as
root, which may write read-only files and read every folder, and so hides permission bugs.
The learner-facing tests therefore run their commands through ``Learner.run``:

* as root, as the dedicated account ``dl-lab-learner`` (created when missing, with a home of
  its own), switched to with ``setpriv`` (real and effective uid and gid, groups cleared,
  no capabilities kept), in a minimal environment;
* as any other user, as that user (it already is an ordinary one).

The account must reach the interpreter and the venv: the folders above them are made
traversable (``o+x``: enter, not list) where they are not, as a learner's own install is.
The checkout is a copy of this one (the files git tracks or would track) owned by the
learner, with ``.venv`` a link to this checkout's venv: the realistic case of a learner who
cloned the lab and set it up, without a second install.

Not a test module: tests import it as ``from learner_account import ...``.
"""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT

ACCOUNT = "dl-lab-learner"


@dataclass(frozen=True)
class Learner:
    """Who runs the learner's commands, and how to switch to them."""

    uid: int
    gid: int
    home: Path
    switch: bool  # True: root switches to this account for every command

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` as this learner runs it."""
        if not self.switch:
            return argv
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", *argv]

    def env(self, **extra: str) -> dict[str, str]:
        """A learner's environment: their home, the usual PATH, nothing of root's."""
        env = {"HOME": str(self.home), "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
               "LANG": "C.UTF-8", "NO_MKDOCS_2_WARNING": "1"}
        if "CI" in os.environ:
            env["CI"] = os.environ["CI"]
        env.update(extra)
        return env

    def run(self, argv: list[str], *, cwd: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
        """Run ``argv`` as the learner in ``cwd``; the test fails if it takes over ``timeout`` s."""
        try:
            return subprocess.run(self.argv(argv), cwd=cwd, env=self.env(**env), capture_output=True,
                                  text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"{argv} as the learner did not finish in {timeout} s:\n{exc.stderr}")

    def popen(self, argv: list[str], *, cwd: Path, **env: str) -> subprocess.Popen:
        """Start ``argv`` as the learner in ``cwd`` (stdout and stderr piped, as text)."""
        return subprocess.Popen(self.argv(argv), cwd=cwd, env=self.env(**env), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _traversable(path: Path) -> None:
    """Make every folder above and at ``path`` enterable by others (``o+x``), where it is not."""
    for folder in [path, *path.parents]:
        mode = folder.stat().st_mode
        if not mode & 0o001:
            folder.chmod(mode | 0o001)


def learner() -> Learner:
    """The ordinary user the learner-facing tests run as (see the module docstring)."""
    if os.geteuid() != 0:
        return Learner(os.getuid(), os.getgid(), Path.home(), switch=False)
    if shutil.which("setpriv") is None:
        pytest.fail("running as root, the learner tests need setpriv (util-linux) to drop privileges")
    import fcntl

    with open(Path(tempfile.gettempdir()) / f"{ACCOUNT}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # test processes running side by side create it once
        try:
            account = pwd.getpwnam(ACCOUNT)
        except KeyError:
            subprocess.run(["useradd", "--system", "--user-group", "--create-home", "--home-dir", f"/home/{ACCOUNT}",
                            "--shell", "/usr/sbin/nologin", ACCOUNT], check=True, capture_output=True)
            account = pwd.getpwnam(ACCOUNT)
    home = Path(account.pw_dir)
    if not home.is_dir():
        home.mkdir(parents=True)
        os.chown(home, account.pw_uid, account.pw_gid)
    for needed in (Path(os.path.realpath(sys.base_prefix)), Path(os.path.realpath(sys.prefix)),
                   Path(os.path.realpath(sys.executable)).parent):
        _traversable(needed)
    return Learner(account.pw_uid, account.pw_gid, home, switch=True)


def checkout(owner: Learner) -> Path:
    """A copy of this checkout owned by ``owner`` (the files git tracks or would track), with
    ``.venv`` linking to this checkout's venv. The caller removes it (``shutil.rmtree``)."""
    where = Path(tempfile.mkdtemp(prefix="dl-lab-learner-"))
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            target = where / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    venv = Path(sys.prefix)
    (where / ".venv").symlink_to(venv if venv != Path(sys.base_prefix) else ROOT / ".venv")
    if owner.switch:
        for folder, dirs, names in os.walk(where):
            for name in [*dirs, *names]:
                os.lchown(os.path.join(folder, name), owner.uid, owner.gid)
        os.chown(where, owner.uid, owner.gid)
    where.chmod(0o755)
    return where
