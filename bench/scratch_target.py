"""A scratch deploy target for benches: a git repo, fix files, a playbook and an inventory that
reaches the repo over SSH through a given port (a relay in front of the fixture's sshd).

The repo lives on this machine; only the way to it is remote. `reset()` puts it back to its
first commit so every timed run does the same work.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ORIGINAL = {
    "pkg/__init__.py": "",
    "pkg/a.py": "def answer():\n    return 41\n",
    "pkg/b.py": "VALUE = 1\n",
}
FIXED = {
    "pkg/a.py": "def answer():\n    return 42\n\n\ndef extra():\n    return 'new'\n",
    "pkg/b.py": "VALUE = 2\nOTHER = 3\n",
}
MESSAGE = "pkg: answer is 42"
STEPS: list[object] = [
    "local_compile", "upload", "remote_compile",
    {"diff_bounds": {"files": 2, "insertions": [2, 20], "deletions": [0, 5]}},
    {"commit": {"message": MESSAGE}},
]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          timeout=60).stdout


@dataclass
class ScratchTarget:
    root: Path
    repo: Path
    fix_dir: Path
    playbook: Path
    inventory: Path
    runs: Path
    known_hosts: Path
    host_name: str
    initial: str  # the first commit; reset() returns to it

    def reset(self) -> None:
        git(self.repo, "reset", "-q", "--hard", self.initial)
        git(self.repo, "clean", "-q", "-fdx")

    def deployed(self) -> bool:
        """The fix is committed right on top of the first commit (whoever shipped it), and clean."""
        history = git(self.repo, "rev-list", "HEAD").split()
        clean = not git(self.repo, "status", "--porcelain", "--untracked-files=no").strip()
        return history[1:] == [self.initial] and clean and all(
            (self.repo / rel).read_text() == text for rel, text in FIXED.items())

    def deployer_env(self, pythonpath: str) -> dict[str, str]:
        return {**os.environ, "DEPLOYER_INVENTORY": str(self.inventory), "DEPLOYER_RUNS_DIR": str(self.runs),
                "NO_COLOR": "1", "PYTHONPATH": pythonpath}


def make_scratch(root: Path, *, port: int, user: str, identity_file: str, host_pubkey_line: str,
                 host_name: str = "far") -> ScratchTarget:
    """A target under root reached at 127.0.0.1:port, with that port's host key pinned."""
    repo = root / "repo"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "bench@example.invalid")
    git(repo, "config", "user.name", "bench")
    for rel, text in ORIGINAL.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    fix_dir = root / "fix"
    fix_dir.mkdir()
    for rel, text in FIXED.items():
        (fix_dir / Path(rel).name).write_text(text)
    known_hosts = root / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_pubkey_line}\n")
    os.chmod(known_hosts, 0o600)
    playbook = root / "fix.yaml"
    playbook.write_text(yaml.safe_dump({
        "name": "bench fix",
        "files": [{"src": f"fix/{Path(rel).name}", "dest": rel} for rel in FIXED],
        "steps": STEPS,
    }, sort_keys=False))
    inventory = root / "hosts.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": {host_name: {
        "transport": "ssh", "address": "127.0.0.1", "port": port, "user": user,
        "identity_file": identity_file, "known_hosts": str(known_hosts),
        "repo": str(repo), "python": sys.executable,
    }}}, sort_keys=False))
    return ScratchTarget(root=root, repo=repo, fix_dir=fix_dir, playbook=playbook, inventory=inventory,
                         runs=root / "runs", known_hosts=known_hosts, host_name=host_name,
                         initial=git(repo, "rev-parse", "HEAD").strip())
