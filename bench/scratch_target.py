"""A scratch deploy target for benches: a git repo, fix files, a playbook and an inventory that
reaches the repo over SSH through a given port (a relay in front of the fixture's sshd).

The repo lives on this machine; only the way to it is remote. `reset()` puts it back to its
first commit so every timed run does the same work. The pieces (a repo, the fix and its playbook,
an inventory entry, the floor's one-exec command) are public so a bench of many targets reuses them.
"""

from __future__ import annotations

import compileall
import io
import os
import subprocess
import sys
import tarfile
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


def init_repo(repo: Path) -> str:
    """A git repo at repo holding ORIGINAL in one commit; returns that commit."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "bench@example.invalid")
    git(repo, "config", "user.name", "bench")
    for rel, text in ORIGINAL.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    return git(repo, "rev-parse", "HEAD").strip()


def reset_repo(repo: Path, initial: str) -> None:
    git(repo, "reset", "-q", "--hard", initial)
    git(repo, "clean", "-q", "-fdx")


def is_deployed(repo: Path, initial: str) -> bool:
    """The fix is committed right on top of the first commit (whoever shipped it), and clean."""
    history = git(repo, "rev-list", "HEAD").split()
    clean = not git(repo, "status", "--porcelain", "--untracked-files=no").strip()
    return history[1:] == [initial] and clean and all(
        (repo / rel).read_text() == text for rel, text in FIXED.items())


def write_fix(root: Path) -> tuple[Path, Path]:
    """The fixed files under root/fix and the playbook root/fix.yaml that ships them; returns both."""
    fix_dir = root / "fix"
    fix_dir.mkdir(parents=True)
    for rel, text in FIXED.items():
        (fix_dir / Path(rel).name).write_text(text)
    playbook = root / "fix.yaml"
    playbook.write_text(yaml.safe_dump({
        "name": "bench fix",
        "files": [{"src": f"fix/{Path(rel).name}", "dest": rel} for rel in FIXED],
        "steps": STEPS,
    }, sort_keys=False))
    return fix_dir, playbook


def host_entry(*, port: int, user: str, identity_file: str, known_hosts: Path, repo: Path) -> dict[str, object]:
    """An inventory host reaching repo over SSH at 127.0.0.1:port."""
    return {"transport": "ssh", "address": "127.0.0.1", "port": port, "user": user,
            "identity_file": identity_file, "known_hosts": str(known_hosts), "repo": str(repo),
            "python": sys.executable}


def ssh_options(identity_file: str, known_hosts: Path) -> list[str]:
    """OpenSSH client options for the floor and by-hand ways."""
    # -F /dev/null: never the developer's ~/.ssh/config (a ControlMaster there would hide the cost).
    return ["-F", "/dev/null", "-i", identity_file, "-o", f"UserKnownHostsFile={known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]


def remote_chain(repo: Path) -> str:
    """Compile, check and commit the uploaded fix in repo: the playbook's remote steps as one shell line."""
    files = " ".join(FIXED)
    return (f"cd {repo} && {sys.executable} -m py_compile {files} && git diff --numstat && "
            f"git commit -q -m '{MESSAGE}' -- {files}")


def floor_line(repo: Path) -> str:
    """The floor's one exec: unpack fix_tar() from stdin into repo, then remote_chain()."""
    return f"tar -x -C {repo} -f - && " + remote_chain(repo)


def fix_tar(fix_dir: Path) -> bytes:
    """The fixed files as a tar, at their paths in the repo."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel in FIXED:
            tar.add(fix_dir / Path(rel).name, arcname=rel)
    return buf.getvalue()



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
        reset_repo(self.repo, self.initial)

    def deployed(self) -> bool:
        return is_deployed(self.repo, self.initial)

    def deployer_env(self, pythonpath: str) -> dict[str, str]:
        # Its own cache: the known-good records (transport/early.py) of this scratch target only.
        return {**os.environ, "DEPLOYER_INVENTORY": str(self.inventory), "DEPLOYER_RUNS_DIR": str(self.runs),
                "NO_COLOR": "1", "PYTHONPATH": pythonpath, "XDG_CACHE_HOME": str(self.root / "cache"),
                "DEPLOYER_DAEMON": "off"}  # each run a fresh process unless a way says otherwise


def make_scratch(root: Path, *, port: int, user: str, identity_file: str, host_pubkey_line: str,
                 host_name: str = "far") -> ScratchTarget:
    """A target under root reached at 127.0.0.1:port, with that port's host key pinned."""
    repo = root / "repo"
    initial = init_repo(repo)
    fix_dir, playbook = write_fix(root)
    known_hosts = root / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_pubkey_line}\n")
    os.chmod(known_hosts, 0o600)
    inventory = root / "hosts.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": {host_name: host_entry(
        port=port, user=user, identity_file=identity_file, known_hosts=known_hosts, repo=repo)}}, sort_keys=False))
    return ScratchTarget(root=root, repo=repo, fix_dir=fix_dir, playbook=playbook, inventory=inventory,
                         runs=root / "runs", known_hosts=known_hosts, host_name=host_name, initial=initial)


def byte_compiled(tree: Path) -> None:
    """Measure deployer as installed: pip byte-compiles a package when it installs it. Without this, a shell
    that sets PYTHONDONTWRITEBYTECODE (some sandboxes do) makes every timed run compile deployer's
    source anew, a cost no installed copy pays. The same for the code table (deployer/codetable.py), which a
    tree has once a command wrote it or `python -m deployer.warm` did (a tree from before it: nothing to do)."""
    if not compileall.compile_dir(str(tree / "deployer"), quiet=1):
        raise SystemExit(f"cannot byte-compile {tree / 'deployer'}")
    if (tree / "deployer" / "warm.py").exists():
        done = subprocess.run([sys.executable, "-m", "deployer.warm"], cwd=tree, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(tree)})
        if done.returncode != 0:
            raise SystemExit(f"cannot write {tree}'s code table: {done.stderr.strip()[-500:]}")
