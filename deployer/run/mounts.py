"""Where a file shipped into a container lives: on a bind mount or a volume (persistent), or in the container's
writable layer (kept across a restart, lost when the container is recreated), from `<engine> inspect`.

The engine is the host's and the agent runs inside the container, so the inspect runs beside the agent, on a pipe of
the host's own transport, started when preflight sends its reads: it overlaps their round trip instead of adding
one, and it is read once per connection. What the engine prints is input, not truth: the Id must be hex, each
mount's Destination an absolute, normalised path; a Type deployer does not know is shown escaped and never counts
as persistent. The run log's `placement` event keeps the container's id and each dest's place, so a later look
(check, runs show, rollback) can tell that the container was recreated since.
"""

from __future__ import annotations

import json
import posixpath
import re
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from threading import Thread
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from deployer.command import container_inspect
from deployer.config import yamlsrc
from deployer.errors import ConfigError, DeployerError, StepFailed
from deployer.runlog import EVENTS, Run, is_run_id, read_run
from deployer.text import visible

if TYPE_CHECKING:
    from deployer.steps.context import Context
    from deployer.transport.base import Transport

STEP = "preflight"
INSPECT_BYTES = 1 << 20  # one container's inspect is ~10 KiB; more is not an inspect
INSPECT_TIMEOUT_S = 30.0
CONTAINER_ID = re.compile(r"^[0-9a-f]{12,128}$")
PERSISTENT = ("bind", "volume")
LAYER = "layer"
IN_LAYER = "in the container's writable layer: kept across restart, lost when the container is recreated"
NEWEST = 50  # a host's runs looked through for the newest it left (into a container, a pod)
FIELDS = ("kind", "source", "mount")
T = TypeVar("T")


@dataclass(frozen=True)
class Mount:
    """One mount of a container as its engine's inspect lists it."""
    kind: str  # the engine's Type: bind, volume, tmpfs, ... (anything else is shown escaped)
    destination: str  # in the container
    source: str  # on the host
    name: str  # a volume's name


@dataclass(frozen=True)
class Place:
    """Where one path of the container lives."""

    kind: str  # bind | volume | layer | another mount type
    source: str = ""  # a bind's host path, a volume's name
    mount: str = ""  # the mount's Destination

    @property
    def persistent(self) -> bool:
        return self.kind in PERSISTENT

    def describe(self) -> str:
        source, mount = visible(self.source, multiline=False), visible(self.mount, multiline=False)
        if self.kind == "bind":
            return f"bind mount of the host's {source} at {mount}: persistent"
        if self.kind == "volume":
            return f"volume {source} at {mount}: persistent"
        if self.kind == LAYER:
            return IN_LAYER
        return (f"a {visible(self.kind, multiline=False)!r} mount at {mount} (a type deployer does not know: "
                "not counted as persistent)")

    def record(self) -> dict[str, str]:
        return {"kind": self.kind, "source": self.source, "mount": self.mount}


@dataclass(frozen=True)
class Inspected:
    """The container's id and mounts, validated."""

    id: str
    mounts: tuple[Mount, ...]

    def place(self, path: str) -> Place:
        """The mount whose Destination is the longest prefix of path (a nested mount wins), else the layer."""
        holding = [m for m in self.mounts if path == m.destination or path.startswith(m.destination.rstrip("/") + "/")]
        if not holding:
            return Place(LAYER)
        mount = max(holding, key=lambda m: len(m.destination))
        return Place(mount.kind, mount.name if mount.kind == "volume" and mount.name else mount.source,
                     mount.destination)


def parse(out: str) -> Inspected:
    """`<engine> inspect --type container NAME`'s JSON (a list of one object), or ValueError saying what is wrong."""
    try:
        data = json.loads(out)
    except ValueError:
        raise ValueError(f"not JSON: {visible(out[:200], multiline=False)}") from None
    if not (isinstance(data, list) and len(data) == 1 and isinstance(data[0], dict)):
        raise ValueError("not a list of one container")
    found, mounts = data[0].get("Id"), data[0].get("Mounts")
    if not (isinstance(found, str) and CONTAINER_ID.match(found)):
        raise ValueError(f"its Id is not a container id: {visible(str(found)[:80], multiline=False)}")
    if not isinstance(mounts, list):
        raise ValueError("its Mounts is not a list")
    return Inspected(found, tuple(_mount(m) for m in mounts))


def _mount(entry: Any) -> Mount:
    if not isinstance(entry, dict):
        raise ValueError("a mount is not an object")
    kind, dest = entry.get("Type"), entry.get("Destination")
    source, name = entry.get("Source", ""), entry.get("Name", "")
    if not (isinstance(dest, str) and posixpath.isabs(dest) and "\0" not in dest
            and posixpath.normpath(dest) == (dest.rstrip("/") or "/")):
        raise ValueError(f"a mount's Destination is not an absolute path: {visible(str(dest)[:200], multiline=False)}")
    if not (isinstance(kind, str) and isinstance(source, str) and isinstance(name, str)):
        raise ValueError(f"the mount at {visible(dest, multiline=False)} has a Type, Source or Name that is not text")
    return Mount(kind, posixpath.normpath(dest), source, name)


class Inspection(Generic[T]):
    """One read on the host beside the agent (`<engine> inspect`, `kubectl get pod`: run/pods.py), run on a thread
    of its own from the moment it is made; parse turns what it printed into its result (ValueError: not that)."""

    def __init__(self, transport: Transport, argv: Sequence[str], parse: Callable[[str], T], name: str) -> None:
        self._argv = list(argv)
        self._parse = parse
        self._future: Future[T] = Future()
        Thread(target=self._read, args=(transport,), name=name, daemon=True).start()

    def _read(self, transport: Transport) -> None:
        try:
            pipe = transport.host_pipe(self._argv)
            out = bytearray()
            try:
                while (chunk := pipe.read(65536)) and len(out) <= INSPECT_BYTES:
                    out += chunk
                said = pipe.stderr_tail()
            finally:
                pipe.close()
            try:
                self._future.set_result(self._parse(out.decode("utf-8", "replace")))
            except ValueError as exc:
                tail = visible(said.strip(), multiline=False)[-300:]
                raise DeployerError(f"{exc}{f' ({tail})' if tail else ''}") from None
        except BaseException as exc:  # handed to whoever reads the result
            self._future.set_exception(exc)

    def result(self) -> T:
        """What the read printed, parsed; StepFailed naming the command and what it printed otherwise."""
        command = " ".join(self._argv)
        try:
            return self._future.result(INSPECT_TIMEOUT_S)
        except TimeoutError:
            raise StepFailed(STEP, f"{command} did not answer within {INSPECT_TIMEOUT_S:.0f}s") from None
        except DeployerError as exc:
            raise StepFailed(STEP, f"cannot tell where the files live: {command}: {exc}") from None


_started: weakref.WeakKeyDictionary[Transport, Inspection[Inspected]] = weakref.WeakKeyDictionary()


def inspection(ctx: Context) -> Inspection[Inspected] | None:
    """The container's inspect for this connection (started on the first call), or None: not a container."""
    container = ctx.host.container
    if container is None:
        return None
    if ctx.transport not in _started:
        _started[ctx.transport] = Inspection(ctx.transport, container_inspect(container.command, container.name),
                                             parse, f"inspect-{container.name}")
    return _started[ctx.transport]


def place_dests(ctx: Context, dests: list[str]) -> dict[str, Any] | None:
    """Where each dest lives in the host's container (None: not a container), recorded in the run's facts and its
    `placement` event with the container's id."""
    started, container = inspection(ctx), ctx.host.container
    if started is None or container is None:
        return None
    seen = started.result()
    placed = {"container": container.name, "engine": container.engine, "id": seen.id,
              "files": {dest: seen.place(ctx.in_repo(dest)).record() for dest in dests}}
    ctx.facts.placement = placed
    ctx.emit("placement", **placed)
    return placed


def refuse_layer(ctx: Context, placed: dict[str, Any] | None) -> None:
    """`persist: required`: a dest that is not on a bind mount or volume refuses the run (nothing changed yet)."""
    if placed is None or ctx.playbook.model.persist != "required":
        return
    layered = [dest for dest, place in placed["files"].items() if place["kind"] not in PERSISTENT]
    if layered:
        where = yamlsrc.load(ctx.playbook.path).mark(("persist",))
        # A playbook setting this target cannot meet, as for a pod (run/pods.py): exit 2.
        raise ConfigError(f"{where}: persist: required, but {', '.join(layered)} in {placed['engine']} "
                          f"container {placed['container']} is not on a bind mount or volume "
                          f"({Place(**placed['files'][layered[0]]).describe()}); nothing was changed. Mount the repo "
                          "(or those files) into the container, or drop persist: required")


def refuse_if_recreated(ctx: Context, run: Run) -> None:
    """A rollback of a run into a container that was recreated since: the run's files in the old container's
    writable layer went with it (the new one has the image's), so there is nothing there to undo and the run's
    commit is not in its history: refused, nothing changed. With every file on a mount, the rollback goes on."""
    placed = recorded(run)
    if placed is None or inspection(ctx) is None:
        return
    now = place_dests(ctx, list(placed["files"]))  # the rollback's own log records the container it found
    assert now is not None
    said = gone(placed, now["id"])
    if said is None:
        return
    if any(place["kind"] not in PERSISTENT for place in placed["files"].values()):
        raise ConfigError(f"run {run.run_id}: {said}; rollback cannot undo what is no longer there, and refuses "
                          "(nothing was changed)")
    ctx.emit("container_recreated", message=said)


def describe(placed: dict[str, Any]) -> dict[str, str]:
    """Each recorded dest's place, for people."""
    return {dest: Place(**place).describe() for dest, place in placed["files"].items()}


def recorded(run: Run) -> dict[str, Any] | None:
    """The placement a run recorded, if it is the shape place_dests writes (a log is input too)."""
    event = run.first("placement")
    if event is None or not isinstance(event.get("id"), str) or not CONTAINER_ID.match(event["id"]):
        return None
    files = event.get("files")
    if not isinstance(files, dict) or not all(
            isinstance(p, dict) and all(isinstance(p.get(k), str) for k in FIELDS) for p in files.values()):
        return None
    return {**event, "files": {dest: {k: place[k] for k in FIELDS} for dest, place in files.items()}}


def newest_runs_on(runs_dir: Path, host: str) -> Iterator[Run]:
    """The host's runs among the NEWEST of runs_dir, newest first: where a later look finds what a run left."""
    names = sorted((p.name for p in runs_dir.iterdir() if is_run_id(p.name) and (p / EVENTS).is_file()),
                   reverse=True) if runs_dir.is_dir() else []
    for name in names[:NEWEST]:
        try:
            run = read_run(runs_dir, name)
        except DeployerError:
            continue  # a log that cannot be read is `runs verify`'s to report
        if run.start.get("host") == host:
            yield run


def _placed_runs(runs_dir: Path, host: str, container: str) -> Iterator[tuple[Run, dict[str, Any]]]:
    """The host's runs that recorded where their files live in this container, newest first (of the NEWEST)."""
    for run in newest_runs_on(runs_dir, host):
        placed = recorded(run)
        if placed is not None and placed.get("container") == container:
            yield run, placed


def last_placement(runs_dir: Path, host: str, container: str) -> tuple[str, dict[str, Any]] | None:
    """The host's newest apply that committed files into this container, with the placement it recorded."""
    return next(((run.run_id, placed) for run, placed in _placed_runs(runs_dir, host, container)
                 if run.start.get("kind") == "apply" and run.git.get("after")), None)


def shown(run: Run) -> list[str]:
    """What `runs show` says of a run into a container: where each file lived, and whether a later run on the host
    found the container recreated (runs show reads no target: `deployer check` asks the engine now)."""
    placed = recorded(run)
    if placed is None:
        return []
    lines = [f"in {placed['engine']} container {placed['container']} (id {placed['id'][:12]}):",
             *(f"  {dest}: {where}" for dest, where in describe(placed).items())]
    later = next(((r.run_id, p) for r, p in _placed_runs(run.dir.parent, str(run.start.get("host")),
                                                         str(placed["container"])) if r.run_id > run.run_id), None)
    if later is not None and (said := gone(placed, later[1]["id"])) is not None:
        lines.append(f"{said} (as run {later[0]} found it)")
    return lines


def gone(placed: dict[str, Any], now: str) -> str | None:
    """What a recreated container lost of a run's files (None: the same container as at the run)."""
    if placed["id"] == now:
        return None
    layered = sorted(d for d, p in placed["files"].items() if p["kind"] not in PERSISTENT)
    kept = sorted(d for d, p in placed["files"].items() if p["kind"] in PERSISTENT)
    said = (f"container {placed['container']} was recreated since the run (id {placed['id'][:12]} then, "
            f"{now[:12]} now)")
    if layered:
        said += f": the run's files in its writable layer are gone from it ({', '.join(layered)})"
    if kept:
        said += f"{'; ' if layered else ': '}those on a mount stay ({', '.join(kept)})"
    return said
