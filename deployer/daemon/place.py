"""Where this user's daemon for this install listens, and the stamp of the code a daemon serves."""

from __future__ import annotations

import os
import stat
import sys
import zlib
from pathlib import Path

from deployer.sources import PACKAGE, code_stamp

_SUN_PATH_MAX = 107  # sockaddr_un's path, less its terminating NUL


def folder() -> Path:
    """The folder the daemon's socket lives in (it may not exist yet)."""
    chosen = os.environ.get("DEPLOYER_DAEMON_DIR")
    if chosen:
        return Path(os.path.abspath(chosen))  # the daemon runs in /
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "deployer"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "deployer" / "daemon"


def install_id() -> str:
    """This interpreter and this deployer package: two venvs, or two checkouts, each get their own daemon."""
    return f"{zlib.crc32(os.fsencode(os.path.realpath(sys.executable)) + b'/' + os.fsencode(PACKAGE)):08x}"


def socket_path(base: Path | None = None) -> Path:
    return (folder() if base is None else base) / f"{install_id()}.sock"


def might_answer() -> bool:
    """Whether a daemon may take this command: not turned off, and a socket where this install's would be. One
    stat: a command that runs on its own pays nothing more (not even the imports that talk to a daemon)."""
    # `deployer daemon ...` runs on its own: a stale daemon asked about itself would exit before it answered.
    return (os.environ.get("DEPLOYER_DAEMON") != "off" and sys.argv[1:2] != ["daemon"]
            and os.path.exists(socket_path()))


def private_folder(base: Path, make: bool) -> str | None:
    """Why `base` cannot hold a daemon's socket (None: it can): it must be a folder (not a link), owned by this
    user, that no one else can enter. `make` creates it (mode 0700) where it is missing."""
    if make:
        try:
            base.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            return f"{base} cannot be made: {exc.strerror}"
    try:
        found = os.lstat(base)
    except FileNotFoundError:
        return f"{base} does not exist"
    if stat.S_ISLNK(found.st_mode):
        return f"{base} is a symbolic link, not a folder of its own"
    if not stat.S_ISDIR(found.st_mode):
        return f"{base} is not a folder"
    if found.st_uid != os.geteuid():
        return f"{base} belongs to uid {found.st_uid}, not to this user ({os.geteuid()})"
    if found.st_mode & 0o077:
        return f"{base} is open to others (mode {stat.S_IMODE(found.st_mode):04o}; it must be 0700)"
    if len(os.fsencode(socket_path(base))) > _SUN_PATH_MAX:
        return f"{socket_path(base)} is longer than a unix socket's path may be"
    return None


def script_less_path() -> list[str]:
    """sys.path less the folder of the script that started this interpreter (none under -P, PYTHONSAFEPATH)."""
    return list(sys.path) if getattr(sys.flags, "safe_path", False) else sys.path[1:]


def stamp(search_path: list[str]) -> dict[str, str]:
    """What a command would run, as text compared whole (a few KB; hashing it would cost the command more than
    sending it). `caller`: what the process brings — the module search path (`search_path`: sys.path less the
    starting script's folder), the interpreter's flags and options, the environment modules read when they are
    imported, and the process's place in the system (namespaces, cgroup, nice, CPUs, groups, limits), which a
    fork would take from the daemon, not from the caller; a daemon started under another serves this caller no
    command (it runs on its own) and others still. `code`: deployer's files (sources.code_stamp), the
    interpreter and each search folder's mtime (installing or removing a package changes it); a daemon whose
    code differs for the same caller is out of date."""
    code = [sys.executable, sys.version, str(PACKAGE),
            *(f"{path} {size} {mtime}" for path, size, mtime in code_stamp())]
    for entry in search_path:
        try:
            code.append(f"{entry} {os.stat(entry).st_mtime_ns}")
        except OSError:
            code.append(f"{entry} -")
    caller = [*search_path, str(sys.flags), str(sys.dont_write_bytecode), str(sys.warnoptions),
              str(sorted(sys._xoptions.items())), *_context(),
              *(f"{name}={value}" for name, value in sorted(os.environ.items())
                if name.startswith(("PYTHON", "PYDANTIC")) or name == "DEPLOYER_CODE_TABLE")]
    return {"code": "\n".join(code), "caller": "\n".join(caller)}


_NAMESPACES = ("net", "mnt", "pid", "uts", "ipc", "user", "cgroup")
_LIMITS = ("RLIMIT_AS", "RLIMIT_CORE", "RLIMIT_CPU", "RLIMIT_DATA", "RLIMIT_FSIZE", "RLIMIT_MEMLOCK",
           "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_STACK")


def _context() -> list[str]:
    """This process's place in the system, as far as a fork of another process would not share it: `unshare -n`,
    `ip netns exec`, `nice`, `taskset`, `ulimit`, `sg`, systemd-run or a job scheduler's cgroup."""
    import resource

    found = []
    for kind in _NAMESPACES:
        try:
            found.append(os.readlink(f"/proc/self/ns/{kind}"))
        except OSError:
            found.append(f"{kind}:-")
    try:
        with open("/proc/self/cgroup") as cgroup:
            found.append(cgroup.read())
    except OSError:
        found.append("cgroup -")
    found += [f"nice {os.getpriority(os.PRIO_PROCESS, 0)}", f"gid {os.getgid()} {os.getegid()}",
              f"groups {sorted(os.getgroups())}"]
    if hasattr(os, "sched_getaffinity"):
        found.append(f"cpus {sorted(os.sched_getaffinity(0))}")
    found += [f"{name} {resource.getrlimit(getattr(resource, name))}" for name in _LIMITS
              if hasattr(resource, name)]
    return found
