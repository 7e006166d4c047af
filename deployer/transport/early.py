"""An SSH connection opened before the config is loaded, for a config this machine has already checked.

An apply loads and checks its inventory and playbook before anything connects: a config problem must never
reach the host. That load is most of an apply's start-up (pydantic, the models, the steps), and a far host's
handshake used to wait for it. So a single-host apply whose config has passed every check records the
connection it then opened, under a key of everything those checks read: the inventory's and the playbook's
bytes, the command's options, the environment variables the inventory names, the working directory, this
python and deployer's own files. A later apply with the same key opens that connection at once and loads the
config again meanwhile. For a host whose agent runs as the login's user on the host itself (no `become`, no
container) the agent's interpreter starts too, as soon as the login is in: most of the agent's start is that
interpreter's, and it waits for its first request, which comes only once this process's own checks have passed
and give the host the recorded params. With `become` (a sudo is a privilege asked for) or a container (its
engine's exec), the agent starts only then. Otherwise the connection closes unused, and an agent that went ahead
reads the end of its input and exits (Build.opening). So what reaches a host early is a login and, at most, an
idle agent (which keeps its own copy in the user's cache, as any run's does): never a command of the run, and
only for a config that passed before.

The files a playbook ships are not in the key (they change with each fix): they are read and checked after
the connection opened, before anything runs. A host under `accept-new` is never opened early: its first
connection pins a key, which a config that then fails must not do.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import stat
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from deployer.config.paths import find_inventory
from deployer.errors import ConfigError
from deployer.sources import code_stamp
from deployer.transport.ssh.params import SshParams

if TYPE_CHECKING:
    from deployer.config.models import Host
    from deployer.transport.factory import Opening

KEPT = 32  # records kept, the newest: one per config and options a person applies
RECORD_BYTES = 16 << 10  # a record is a host name and ten params: anything longer is not one
LIBRARIES = ("pydantic", "pydantic_core", "yaml", "click", "paramiko")  # what loads and checks the config
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def library_stamp() -> list[tuple[str, str | None, int, int]]:
    """The origin of each library the checks run (found, not imported): an upgrade in this venv changes the key."""
    stamp: list[tuple[str, str | None, int, int]] = []
    for name in LIBRARIES:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        st = os.stat(origin) if origin else None
        stamp.append((name, origin, st.st_size if st else 0, st.st_mtime_ns if st else 0))
    return stamp


def _regular(path: str, flags: int) -> int:
    """An fd of path only if it is a plain file (never blocking on a FIFO put there)."""
    fd = os.open(path, flags | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a plain file")
    return fd


def records_dir() -> Path:
    """This user's cache (XDG): the runs dir holds runs only, and the key says everything a record depends on."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "deployer" / "known-good"


class KnownGood:
    """One apply's key, and its record: the host its checked config connected to, and how."""

    def __init__(self, records: Path, key: str) -> None:
        self.records = records
        self.key = key

    @classmethod
    def of(cls, options: Mapping[str, object], playbook: str, inventory: str | None) -> KnownGood | None:
        """The key of an apply with these options; None where a file it reads is missing (its load says why)."""
        try:
            inventory_path = find_inventory(inventory)
            inventory_bytes = inventory_path.read_bytes()
            playbook_bytes = Path(playbook).read_bytes()
            stamp, cwd = code_stamp(), os.getcwd()
        except (ConfigError, OSError):
            return None
        named = set(_NAME.findall(inventory_bytes.decode("utf-8", "replace")))
        env = {k: v for k, v in os.environ.items() if k in named or k.startswith("DEPLOYER_")}
        inputs = {"deployer": stamp, "libraries": library_stamp(), "python": [sys.version, sys.executable],
                  "cwd": cwd, "options": dict(options), "env": env,
                  "inventory": [str(inventory_path), hashlib.sha256(inventory_bytes).hexdigest()],
                  "playbook": [playbook, hashlib.sha256(playbook_bytes).hexdigest()]}
        blob = json.dumps(inputs, sort_keys=True, default=repr).encode()
        return cls(records_dir(), hashlib.sha256(blob).hexdigest())

    @property
    def path(self) -> Path:
        return self.records / f"{self.key}.json"

    def opening(self) -> Opening | None:
        """The recorded host's connection, opening now; None without a record (or with one this run cannot
        have written: it is this machine's file, and still not trusted to be well formed)."""
        try:
            with open(self.path, "rb", opener=_regular) as record:
                raw = record.read(RECORD_BYTES + 1)
            data = json.loads(raw) if len(raw) <= RECORD_BYTES else None
            host = data.get("host") if isinstance(data, dict) else None
            params = SshParams.from_document(data.get("ssh")) if isinstance(data, dict) else None
            ahead = isinstance(data, dict) and data.get("agent") == "ahead"
        except Exception:  # whatever the file holds (nested too deep, a number too large...), it is no record
            return None
        if (not isinstance(host, str) or not host or len(host) > 255 or not host.isprintable() or params is None
                or params.host_key_policy != "reject"):
            return None
        from deployer.transport.factory import Opening  # the agent's client and protocol: after the lookup

        return Opening.early(host, params, agent_ahead=ahead)

    def record(self, name: str, host: Host) -> None:
        """name's config passed every check with this key: an SSH host under `reject` is opened early next time."""
        from deployer.config.models import SshHost  # loaded by now: the checks were its

        if not isinstance(host, SshHost) or host.host_key_policy != "reject":
            return
        records = self.records
        with contextlib.suppress(OSError):  # only a later apply's start-up is lost without it
            records.mkdir(parents=True, exist_ok=True)
            temp = records / f".{self.key}.{os.getpid()}.tmp"
            # The agent goes ahead only where it runs on the host itself, as the login's user (neither a container's
            # exec nor a sudo before this process's own checks).
            agent = "ahead" if host.container is None and not host.become else "on-release"
            # Made here, never written through a link planted at its name (unlink takes the link itself away).
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(json.dumps({"host": name, "ssh": SshParams.of(name, host).document(), "agent": agent}))
            os.replace(temp, self.path)
            for old in sorted(records.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)[:-KEPT]:
                old.unlink()
