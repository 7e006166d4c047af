"""`init` (`deployer init`): a playbook written from a change in a local git checkout, measured rather than typed.

The local side is read with GitPython (the target keeps going through the transport). The
changed files are copied beside the new playbook (or written as one patch), each `dest` is
the repo-relative path, and `diff_bounds` is set around the counts measured with the same
diff the plan projects, so a mistyped dest or a bound that does not fit the change cannot
slip in at this step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import git
import yaml

from deployer import diffs
from deployer.config.models import Host, check_repo_relative, get_host, load_inventory
from deployer.config.paths import find_inventory
from deployer.errors import ConfigError
from deployer.steps.playbook import BINARY_PROBE

SYMLINK, SUBMODULE = "120000", "160000"


@dataclass(frozen=True)
class ChangedFile:
    """A file the scaffolded playbook ships, with its line counts."""
    dest: str
    insertions: int
    deletions: int
    new: bool  # git does not track it at the base: the playbook marks it `create: true`


@dataclass(frozen=True, kw_only=True)
class InitOptions:
    """source: the local git checkout holding the fix; base: the changes against this ref (HEAD: the uncommitted
    work) or a range A..B; output: the playbook to write (its files beside it, or as_patch one patch file);
    message: the commit message (None: the local commit's subject); host: an inventory host whose supported
    steps are added (co_restart of its services; with metric, the gauge that shows the symptom: baseline and
    drain)."""

    source: str | Path
    base: str = "HEAD"
    output: str | Path = "fix.yaml"
    as_patch: bool = False
    message: str | None = None
    host: str | None = None
    metric: str | None = None
    inventory: str | Path | None = None


@dataclass
class Made:
    """What `init` wrote, and what it has to say about it: the outcome of the use case."""
    playbook: Path
    files: list[ChangedFile]
    message: str
    host_name: str | None = None
    written: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    exit_code: int = 0

    def next_step(self, playbook: object) -> str:
        return f"deployer plan {playbook} --host {self.host_name or 'HOST'}"

    def document(self) -> dict[str, Any]:
        return {"playbook": str(self.playbook), "written": [str(p) for p in self.written],
                "files": [vars(f) for f in self.files], "message": self.message, "exit_code": 0, "error": None}


def init(options: InitOptions) -> Made:
    """Write the playbook options describe; a change or an option that cannot make one raises ConfigError."""
    host = None
    if options.host:
        inventory_path = find_inventory(str(options.inventory) if options.inventory is not None else None)
        host = get_host(load_inventory(inventory_path), options.host, inventory_path)
    return write_playbook(Path(options.source), base=options.base, output=Path(options.output),
                          as_patch=options.as_patch, message=options.message, host=host, metric=options.metric,
                          host_name=options.host)


@dataclass(frozen=True)
class Base:
    """What the change is measured against: `old` (a commit) to `new` (a commit, or None: the work tree)."""

    spec: str
    old: str
    new: str | None


def open_repo(path: Path) -> git.Repo:
    try:
        return git.Repo(path, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise ConfigError(f"--from {path}: not a git checkout") from None


def parse_base(repo: git.Repo, spec: str) -> Base:
    """HEAD (the uncommitted work), a ref (everything since it, uncommitted work included), or A..B / A...B."""
    if "..." in spec:
        left, right = spec.split("...", 1)
        new = resolve(repo, right or "HEAD")
        bases = repo.merge_base(resolve(repo, left), new)
        if not bases:
            raise ConfigError(f"--base {spec}: the two sides share no history")
        return Base(spec, bases[0].hexsha, new)
    if ".." in spec:
        left, right = spec.split("..", 1)
        return Base(spec, resolve(repo, left or "HEAD"), resolve(repo, right or "HEAD"))
    return Base(spec, resolve(repo, spec), None)


def resolve(repo: git.Repo, ref: str) -> str:
    try:
        return str(repo.commit(ref).hexsha)
    except (git.BadName, ValueError, git.GitCommandError):
        raise ConfigError(f"--base: {ref!r} is not a commit in {repo.working_tree_dir}") from None


def changed_files(repo: git.Repo, base: Base) -> dict[str, tuple[bytes | None, bytes]]:
    """dest -> (bytes at the base or None, new bytes); refuses what deployer cannot ship."""
    root = Path(str(repo.working_tree_dir)).resolve()
    raw = repo.git.diff("--raw", "-z", "--no-renames", "--no-abbrev", "--no-ext-diff", base.old,
                        *([base.new] if base.new else []), strip_newline_in_stdout=False)
    fields = raw.split("\0")
    entries: list[tuple[str, str, str]] = []  # (status, new mode, path)
    for meta, path in zip(fields[0::2], fields[1::2], strict=False):
        if meta.startswith(":"):
            _, new_mode, _, _, status = meta[1:].split(" ")
            entries.append((status[0], new_mode, path))
    if base.new is None:  # the work tree: files git does not track yet are part of the change too
        entries += [("A", "100644", path) for path in repo.untracked_files]
    problems, found = [], {}
    for status, mode, path in sorted(entries, key=lambda e: e[2]):
        if status == "D":
            problems.append(f"{path}: deleted; deployer ships new bytes for files, not deletions")
            continue
        if mode in (SYMLINK, SUBMODULE) or status == "T":
            problems.append(f"{path}: {'a submodule' if mode == SUBMODULE else 'a symlink'}; its content lies "
                            "outside the repo's files")
            continue
        if base.new is None:
            local = root / path
            if local.is_symlink() or not local.resolve().is_relative_to(root):
                problems.append(f"{path}: resolves outside the repo ({local.resolve()})")
                continue
            new = local.read_bytes()
        else:
            new = blob_bytes(repo, base.new, path)
        old = None if status == "A" else blob_bytes(repo, base.old, path)
        if b"\0" in new[:BINARY_PROBE] or b"\0" in (old or b"")[:BINARY_PROBE]:
            problems.append(f"{path}: a binary file; deployer ships text files")
            continue
        try:
            check_repo_relative(path)
        except ValueError as exc:
            problems.append(f"{path}: {exc}")
            continue
        if new != old:  # a mode-only change has nothing to ship
            found[path] = (old, new)
    if problems:
        raise ConfigError(f"--from {root} (base {base.spec}): cannot ship this change:\n  " + "\n  ".join(problems))
    if not found:
        raise ConfigError(f"--from {root}: no changes against {base.spec}; nothing to ship")
    return found


def blob_bytes(repo: git.Repo, commit: str, path: str) -> bytes:
    return bytes(repo.commit(commit).tree[path].data_stream.read())


def bound(measured: int) -> int | list[int]:
    """A tight range around a measured count: 10% (at least 2 lines) either side."""
    slack = max(2, measured // 10)
    return [max(0, measured - slack), measured + slack]


def subject_of(repo: git.Repo, base: Base, message: str | None, dests: list[str]) -> tuple[str, bool]:
    """The commit message, and whether it is only a placeholder.

    Uncommitted work alone gets `hotfix: <paths>`: HEAD's subject names a change already committed
    there, not this one."""
    if message:
        return message, False
    head = base.new or repo.head.commit.hexsha
    if head != base.old:  # commits since the base: the newest one names the fix
        return str(repo.commit(head).summary), False
    return f"hotfix: {', '.join(dests)}", True


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "fix"


def storms(host: Host | None) -> bool:
    """A storm has somewhere to go: the host's endpoint."""
    return host is not None and host.endpoint is not None


def steps_for(host: Host | None, metric: str | None, stat: diffs.DiffStat, message: str) -> list[Any]:
    steps: list[Any] = []
    if metric:
        steps.append({"baseline": {"metric": metric, **({"storm": True} if storms(host) else {})}})
    steps += ["local_compile", "upload", "remote_compile",
              {"diff_bounds": {"files": len(stat.files), "insertions": bound(stat.insertions),
                               "deletions": bound(stat.deletions)}},
              {"commit": {"message": message}}]
    if host is not None and host.services:
        steps.append({"co_restart": {"services": list(host.services)}})
    if metric:
        if storms(host):  # right after a restart the gauge is 0 anyway: only new load makes the drain prove the fix
            steps.append("storm")
        steps.append({"drain": {"metric": metric, "to": 0, "within_s": 60}})
    return steps


def write_playbook(source: Path, *, base: str, output: Path, as_patch: bool, message: str | None,
                   host: Host | None, metric: str | None, host_name: str | None = None) -> Made:
    """The playbook and its files; the copies go into a directory named after it (kv.yaml: kv/), so two
    playbooks made side by side never share one."""
    repo = open_repo(source)
    spec = parse_base(repo, base)
    found = changed_files(repo, spec)
    files_dir = output.with_suffix("")
    patch_file = output.with_suffix(".diff")
    for path in (output, patch_file if as_patch else files_dir):
        if path.exists():
            raise ConfigError(f"{path} exists already; choose another -o or remove it")
    stats = {one.path: one for one in diffs.numstats([(dest, old, new) for dest, (old, new) in found.items()])}
    stat = diffs.DiffStat(tuple(stats.values()))
    subject, placeholder = subject_of(repo, spec, message, sorted(found))
    files = [ChangedFile(d, s.insertions, s.deletions, found[d][0] is None) for d, s in stats.items()]
    made = Made(output, files, subject, host_name)
    if placeholder:
        made.notes.append(f"the commit message is {subject!r} (uncommitted work has no subject of its own): "
                          "pass --message or edit the commit step")
    body: dict[str, Any] = {"name": slug(subject)}
    if as_patch:
        patch_file.parent.mkdir(parents=True, exist_ok=True)
        patch_file.write_bytes(patch_text(repo, spec, found))
        body["patch"] = patch_file.name
        made.written.append(patch_file)
    else:
        body["files"] = []
        for change in files:
            copy = files_dir / change.dest
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(found[change.dest][1])
            made.written.append(copy)
            entry: dict[str, Any] = {"src": f"{files_dir.name}/{change.dest}", "dest": change.dest}
            if change.new:
                entry["create"] = True
            body["files"].append(entry)
    body["steps"] = steps_for(host, metric, stat, subject)
    if host is not None and host.services:
        body["on_failure"] = "rollback"
    if host is not None and host.metrics and not metric:
        made.notes.append(f"the host has metrics ({host.metrics}): pass --metric NAME to add baseline and drain")
    warnings = []
    if metric and not storms(host):
        warnings.append(f"no storm: {'the host has no `endpoint`' if host is not None else 'no --host'}, so the "
                        "drain right after the restart starts from an idle gauge and proves nothing; set the "
                        "host's endpoint and run init again, or add a storm step with a url before the drain")
        made.notes += warnings
    head = repo.head.commit.hexsha
    header = (f"# Written by `deployer init` from {Path(str(repo.working_tree_dir)).resolve()}\n"
              f"#   base {spec.spec} ({spec.old[:12]}{'..' + spec.new[:12] if spec.new else ' + uncommitted work'}),"
              f" HEAD {head[:12]}, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC\n"
              f"#   {made.next_step(output.name)}\n" + "".join(f"# WARNING: {w}\n" for w in warnings))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(header + yaml.safe_dump(body, sort_keys=False, width=1000, allow_unicode=True,
                                                    default_flow_style=None))
    made.written.insert(0, output)
    return made


def patch_text(repo: git.Repo, base: Base, found: dict[str, tuple[bytes | None, bytes]]) -> bytes:
    """One patch git apply takes: git's own diff of the tracked files, plus each new file."""
    # Fixed options: a user's diff config (external tools, colour, prefixes) must not change the patch.
    fixed = ("--no-color", "--no-ext-diff", "--no-renames", "--src-prefix=a/", "--dst-prefix=b/", "--full-index")
    tracked = [d for d, (old, _) in found.items() if old is not None]
    text = ""
    if tracked:
        text += repo.git.diff(*fixed, base.old, *([base.new] if base.new else []), "--", *tracked,
                              strip_newline_in_stdout=False)
    for dest, (old, new) in found.items():
        if old is None:
            text += new_file_patch(dest, new)
    return text.encode()


def new_file_patch(dest: str, new: bytes) -> str:
    lines = new.decode("utf-8").splitlines(keepends=True)
    body = "".join("+" + line for line in lines)
    if lines and not lines[-1].endswith("\n"):
        body += "\n\\ No newline at end of file\n"
    header = f"diff --git a/{dest} b/{dest}\nnew file mode 100644\n"
    if not lines:  # git writes no hunk for an empty file
        return header
    return f"{header}--- /dev/null\n+++ b/{dest}\n@@ -0,0 +1,{len(lines)} @@\n{body}"
