"""`bake`: from a hot-fix to an image. A run that shipped a fix and proved it leaves it only on its target; the next
image build, and the controller's own rollout of it, would throw it away. bake writes what makes it permanent,
from the target itself: the run's commit as a patch (`git format-patch`, for the source the image is built from),
and a Dockerfile layer over the image the target runs with the files the commit shipped, at their paths.

Only a run that committed and succeeded (and was not rolled back since) is baked: a fix that failed its checks
after the commit is not one to build into an image (roll it back, or apply a fixed one). Its log must verify and
the target's history vouch for it (run.rollback.target_problems), so an edited log cannot aim the bake at another
commit; what the target prints (the patch, the files, their modes, the image) is input, not truth: each path must
stay inside the repo and be one a Dockerfile names literally, each mode a plain file's.

The image comes from the target, through image_of: the one place a target kind says what it runs from."""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deployer.app.setting import Setting, build_of
from deployer.errors import ConfigError, StepFailed, VerificationFailed
from deployer.text import visible

if TYPE_CHECKING:
    from deployer.config.container import Container
    from deployer.config.models import KubernetesHost
    from deployer.runlog import Run
    from deployer.steps.context import Context, Listener

STEP = "bake"
PATCH_NAME_MAX = 52  # as git format-patch cuts a subject into a file name
# What a Dockerfile's COPY and RUN name literally: no glob (* ? [), no variable ($), no quote, space or escape.
LITERAL_PATH = re.compile(r"^[A-Za-z0-9._+@%=,:/-]+$")
# An image reference as docker and podman print it: [registry[:port]/]name[:tag][@digest], or a bare image id.
IMAGE_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,511}$")
IMAGE_ID = re.compile(r"^(sha256:)?[0-9a-f]{64}$")
PLAIN_KINDS = ("ssh", "local")  # target kinds that run no image of their own (unless the host names a container)
MODES = {"100644": 0o644, "100755": 0o755}  # a commit's plain files; a symlink or submodule is not baked
# A line of `git ls-tree -z`: mode, type, object id, then the path after a tab.
TREE_ENTRY = re.compile(r"^([0-7]{6}) (\w+) ([0-9a-f]{40}|[0-9a-f]{64})\t(.+)$", re.DOTALL)


@dataclass(frozen=True, kw_only=True)
class BakeOptions(Setting):
    """run_id: the run to bake (`last`, or any unique beginning of an id); out: the directory written (it must not
    exist, or be empty; None: ./bake-RUN_ID)."""

    run_id: str
    out: str | Path | None = None


@dataclass(frozen=True)
class BaseImage:
    """The image the target runs from: its reference (the FROM line), the id it runs when the target says
    (a tag may move), and how it was learnt."""

    name: str
    id: str
    source: str


@dataclass(frozen=True)
class Shipped:
    """One file of the run's commit: its dest in the repo, its absolute path in the image, its mode there (a run
    ships files, it never deletes one)."""

    dest: str
    path: str
    mode: int


@dataclass(frozen=True)
class Baked:
    """What bake wrote, under out: the patch, the Dockerfile with the shipped files beside it under files/, and
    a README.txt; from which run, host and commit, over which image (None: a plain host, no image)."""

    run_id: str
    host: str
    commit: str
    before: str
    out: Path
    patch: Path
    dockerfile: Path
    readme: Path
    image: BaseImage | None
    files: list[Shipped]
    vouched: list[str]
    exit_code: int = 0

    def document(self) -> dict[str, Any]:
        image = None if self.image is None else vars(self.image)
        return {"run_id": self.run_id, "host": self.host, "commit": self.commit, "before": self.before,
                "out": str(self.out), "patch": str(self.patch), "dockerfile": str(self.dockerfile),
                "readme": str(self.readme), "image": image,
                "files": [{"dest": f.dest, "path": f.path, "mode": f"{f.mode:04o}"}
                          for f in self.files],
                "vouched": self.vouched, "exit_code": self.exit_code, "error": None}


def bake(options: BakeOptions, *, listener: Listener | None = None) -> Baked:
    """Bake the run options name into options.out. A refusal raises its DeployerError: a run that is not a
    committed, successful apply, or an out dir in use (ConfigError, 2); a log that does not verify or that the
    target's history does not vouch for (VerificationFailed, 5); a target that cannot be reached (ConnectError, 4)."""
    from deployer import runlog
    from deployer.app.runs import resolve
    from deployer.fleet.record import is_fleet
    from deployer.run.rollback import target_problems
    from deployer.steps.gitops import format_patch_argv, git

    build = build_of(options, listener)
    run_id = resolve(build.runs_dir, options.run_id)
    if is_fleet(build.runs_dir, run_id):
        raise ConfigError(f"{run_id} is a fleet run: bake one of its hosts' runs (deployer runs show {run_id} "
                          "names them); each host's image is its own")
    run = runlog.read_run(build.runs_dir, run_id)
    problems = runlog.verify(build.runs_dir, run_id)
    if problems:
        raise VerificationFailed(f"the log of run {run_id} does not verify (deployer runs verify {run_id}); refusing "
                                 "to bake from it:\n  " + "\n  ".join(problems))
    commit, before = bakeable(run)
    out = Path(options.out) if options.out is not None else Path(f"bake-{run_id}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out} is already there and not an empty directory: name another with --out")

    engine = build.for_run(run)
    repo = engine.host.repo
    vouched: list[str] = []
    bus = engine.new_bus()
    with engine.connect(bus) as transport:
        ctx = engine.context("<bake>", bus, transport)
        disagree = target_problems(ctx, run, checked=vouched)
        if disagree:
            raise VerificationFailed(f"the history of {engine.host_name} does not vouch for run {run_id}'s log "
                                     "(deployer runs verify --target); refusing to bake from it:\n  "
                                     + "\n  ".join(disagree))
        image = image_of(ctx)
        subject = ctx.submit(git("log", "-1", "--format=%s", commit, "--"), timeout=60, quiet=True)
        patch = ctx.run(format_patch_argv(commit), timeout=120, quiet=True, capture=None)
        if not patch.ok or not patch.stdout.startswith(f"From {commit} ".encode()):
            raise StepFailed(STEP, f"git format-patch of {commit[:12]} failed on the target: "
                                   f"{visible(patch.err.strip()[-300:], multiline=False)}")
        name = patch_name(subject.result().out.strip())
        files, blobs = shipped_files(ctx, commit, repo, sorted(str(f) for f in (run.end or {}).get("files") or []))
    return write_out(out, run, engine.host_name, commit, before, patch.stdout, name, files, blobs, image, vouched)


def bakeable(run: Run) -> tuple[str, str]:
    """The run's commit and the one before it, or ConfigError saying why this run is not one to bake."""
    from deployer.run.shown import shown_state
    from deployer.runstate import Phase

    kind = run.start.get("kind", "apply")
    if kind != "apply":
        raise ConfigError(f"run {run.run_id} is a {kind}, not an apply: only an apply's fix is baked")
    after, before = run.git.get("after"), run.git.get("before")
    if not after or not before:
        raise ConfigError(f"run {run.run_id} made no commit (it ended {shown_state(run)}): there is no fix to bake")
    if run.status != "successful":
        raise ConfigError(f"run {run.run_id} ended {shown_state(run)}, not succeeded: a fix that did not pass its "
                          "checks is not one to build into an image (roll it back, or apply a fixed one)")
    if shown_state(run) == Phase.rolled_back.value or any(
            link.get("status") == "successful" for link in run.all("rolled_back_by")):
        raise ConfigError(f"run {run.run_id} was rolled back since: its fix is no longer on the target")
    return str(after), str(before)


def shipped_files(ctx: Context, commit: str, repo: str, dests: list[str]) -> tuple[list[Shipped], dict[str, bytes]]:
    """Each dest of the run with its mode and bytes at commit, read from the target (one round trip for the
    bytes); ConfigError for a path or mode a Dockerfile layer cannot carry as it is."""
    from deployer.steps.gitops import OBJECT_ID, git, names

    # What is left when the layer cannot carry a file: the patch, made by hand.
    instead = (f"apply the patch to the image's source instead (git format-patch -1 {commit[:12]} in {repo} on "
               "the target)")
    for path in (repo, *dests):
        if not LITERAL_PATH.match(path):
            raise ConfigError(f"{visible(path, multiline=False)} cannot be named literally in a Dockerfile (only "
                              f"letters, digits and ._+@%=,:/- are): {instead}")
    outside = [d for d in dests
               if posixpath.isabs(d) or posixpath.normpath(d) != d or d.split("/")[0] in ("..", ".git")]
    if outside or not posixpath.isabs(repo):
        raise ConfigError(f"not a path inside the repo {repo}: {', '.join(outside) or repo}")
    listed = ctx.check(git("ls-tree", "-z", "--full-tree", commit, "--", *dests), "cannot list the commit's files",
                       timeout=60, quiet=True).stdout.decode(errors="replace")
    entries: dict[str, tuple[str, str]] = {}  # dest -> its mode and blob
    for line in names(listed):
        found = TREE_ENTRY.match(line)
        if found is None or found.group(4) not in dests:
            raise StepFailed(STEP, f"git ls-tree printed what is not one of the run's files: "
                                   f"{visible(line[:200], multiline=False)}")
        mode, kind, oid, dest = found.groups()
        if mode not in MODES or kind != "blob" or not OBJECT_ID.fullmatch(oid):
            raise ConfigError(f"{dest} is not a plain file at {commit[:12]} (git mode {mode}): a Dockerfile COPY "
                              f"would not make it so; {instead}")
        entries[dest] = (mode, oid)
    missing = sorted(set(dests) - set(entries))
    if missing:
        raise StepFailed(STEP, f"git ls-tree lists no {', '.join(missing)} at {commit[:12]}, which the run shipped")
    reads = {dest: ctx.submit(git("cat-file", "blob", oid), timeout=120, quiet=True, capture=None)
             for dest, (_, oid) in entries.items()}
    blobs: dict[str, bytes] = {}
    for dest, submitted in reads.items():
        read = submitted.result()
        if not read.ok:
            raise StepFailed(STEP, f"cannot read {dest} at {commit[:12]} on the target")
        blobs[dest] = read.stdout
    return [Shipped(dest, posixpath.join(repo, dest), MODES[entries[dest][0]]) for dest in dests], blobs


def image_of(ctx: Context) -> BaseImage | None:
    """The image the target's code runs from, as the target says it: the one place where a target kind answers.

    A host with `container:`: its engine's inspect of the container, on the host beside it (`.Config.Image`, the
    reference it was created from, else podman's `.ImageName`; `.Image`, the id it runs). A plain host: None, it
    runs no image (the Dockerfile takes the image as its BASE_IMAGE build argument). A kubernetes host: the image
    its pod's container runs (pod_image). Any other kind is refused until it answers here, never taken for a plain
    host."""
    from deployer.config.models import KubernetesHost

    container = ctx.host.container
    if container is not None:
        return container_image(ctx, container)
    if isinstance(ctx.host, KubernetesHost):
        return pod_image(ctx, ctx.host)
    if ctx.host.transport in PLAIN_KINDS:
        return None
    raise ConfigError(f"{ctx.host_name}: bake cannot tell yet which image a {ctx.host.transport} target runs; "
                      "apply the patch it would write to the image's source (git format-patch -1 of the run's "
                      "commit, on the target)")


def container_image(ctx: Context, container: Container) -> BaseImage | None:
    """The image container was created from (None: it was made from a root filesystem, podman's --rootfs)."""
    from deployer.command import container_inspect
    from deployer.transport.container import beside_container

    argv = container_inspect(container.command, container.name)
    said = beside_container(ctx.transport).run(argv, timeout=30)
    command = " ".join(argv)
    if not said.ok:
        raise StepFailed(STEP, f"{command} failed: {visible(said.err.strip()[-300:], multiline=False)}")
    try:
        (found,) = json.loads(said.out)
        config = found.get("Config") or {}
        name, image_id = config.get("Image") or found.get("ImageName") or "", found.get("Image") or ""
    except (ValueError, TypeError, AttributeError):
        raise StepFailed(STEP, f"{command} printed what is not one container's inspect: "
                               f"{visible(said.out[:200], multiline=False)}") from None
    if not name and not image_id:
        return None
    name = name or image_id
    if not (isinstance(name, str) and IMAGE_REF.match(name)) or not (
            isinstance(image_id, str) and (image_id == "" or IMAGE_ID.match(image_id))):
        raise StepFailed(STEP, f"{command} names an image that is not an image reference: "
                               f"{visible(str(name)[:200], multiline=False)} ({visible(str(image_id)[:80])})")
    return BaseImage(name, image_id, f"{container.engine} inspect of container {container.name}")


def pod_image(ctx: Context, host: KubernetesHost) -> BaseImage:
    """The image the pod's container runs, from `kubectl get pod -o json` where kubectl runs (beside the agent in
    the pod)."""
    from deployer.transport.container import beside_container
    from deployer.transport.kubernetes import read_pod

    seen = read_pod(beside_container(ctx.transport), host.pod)
    return pod_base(seen.image, seen.image_id, f"kubectl get pod {host.pod.name}: container {host.pod.container}")


def pod_base(image: str, image_id: str, where: str) -> BaseImage:
    """FROM the imageID a pod's container runs when that is a pullable reference pinned by digest (`repo@sha256:...`,
    as containerd and CRI-O report it; docker's `docker-pullable://` scheme dropped): the very image the fix was
    proved on. Else the spec's image (a tag, which may have moved since), with the imageID as its id when that is
    a bare digest. Both are input: what is not an image reference is refused, never written into the Dockerfile."""
    if not IMAGE_REF.match(image):
        raise StepFailed(STEP, f"{where} names an image that is not an image reference: "
                               f"{visible(image[:200], multiline=False)}")
    said = image_id.partition("://")[2] if "://" in image_id else image_id
    digest = said.rpartition("@")[2]
    if "@" in said and IMAGE_ID.match(digest) and IMAGE_REF.match(said):
        return BaseImage(said, digest, f"{where}'s image {image}, pinned by the digest it runs")
    return BaseImage(image, said if IMAGE_ID.match(said) else "", f"{where}'s image {image}")


def patch_name(subject: str) -> str:
    """`0001-<subject>.patch`, as git format-patch names it: runs of other characters one dash, at most 52."""
    slug = re.sub(r"[^A-Za-z0-9._]+", "-", subject).strip("-.")[:PATCH_NAME_MAX].rstrip("-.")
    return f"0001-{slug or 'fix'}.patch"


def write_out(out: Path, run: Run, host: str, commit: str, before: str, patch: bytes, name: str,
              files: list[Shipped], blobs: dict[str, bytes], image: BaseImage | None, vouched: list[str]) -> Baked:
    out.mkdir(parents=True, exist_ok=True)
    patch_path = out / name
    patch_path.write_bytes(patch)
    for shipped in files:
        copy = out / "files" / shipped.dest
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(blobs[shipped.dest])
        copy.chmod(shipped.mode)  # COPY keeps the context file's mode bits: the commit's, not this umask's
    dockerfile = out / "Dockerfile"
    dockerfile.write_text(dockerfile_text(run.run_id, host, commit, before, image, files))
    readme = out / "README.txt"
    readme.write_text(readme_text(run.run_id, host, commit, before, name, image, files))
    return Baked(run.run_id, host, commit, before, out, patch_path, dockerfile, readme, image, files, vouched)


def dockerfile_text(run_id: str, host: str, commit: str, before: str, image: BaseImage | None,
                    files: list[Shipped]) -> str:
    """FROM the target's image (a plain host's: the BASE_IMAGE build argument), then each shipped file COPYed to
    its absolute path (plain COPY: the mode is the context file's, so no BuildKit is needed)."""
    lines = [f"# Baked by deployer from run {run_id} on {host}: commit {commit} over {before}.",
             "# Each file below holds its bytes at that commit; see README.txt."]
    if image is None:
        lines += ["# The target is a plain host: it runs no image. Name the one its code ships in:",
                  "#   docker build --build-arg BASE_IMAGE=<image> -t <new tag> .",
                  "ARG BASE_IMAGE", "FROM ${BASE_IMAGE}"]
    else:
        runs = f", image id {image.id}" if image.id else ""
        lines += [f"# The image the target runs ({image.source}{runs}).", f"FROM {image.name}"]
    lines += [f"COPY files/{f.dest} {f.path}" for f in files]
    return "\n".join(lines) + "\n"


def readme_text(run_id: str, host: str, commit: str, before: str, patch: str, image: BaseImage | None,
                files: list[Shipped]) -> str:
    if image is None:
        base = ("The host runs no image, so FROM is the BASE_IMAGE build argument: the image its code also ships\n"
                "    in. The paths are the host's repo's; where the image keeps the code elsewhere, edit them.\n\n"
                "        docker build --build-arg BASE_IMAGE=<image> -t <new tag> .")
    else:
        runs = f"; it runs image id {image.id}, and a tag may have moved since" if image.id else ""
        base = (f"FROM {image.name}: the image the target runs ({image.source}{runs}).\n\n"
                "        docker build -t <new tag> .        (podman build the same)")
    shipped = "\n".join(f"        {f.path}  (mode {f.mode:04o})" for f in files)
    return f"""The fix of deployer run {run_id} on {host}, made permanent.

{patch}
    The run's commit {commit} as a patch (git format-patch on the target).
    Apply it to the source the image is built from, at {before[:12]} (the commit
    the run started from), or later code where those lines are unchanged:

        git am {patch}        (or: git apply {patch})

    and the next image build carries the fix.

Dockerfile, files/
    A layer over the image the target runs: each file the commit shipped, at its
    path in the image, with its bytes and mode at the commit (owner root; a plain
    COPY keeps the mode of the file under files/, so no BuildKit is needed):

{shipped}

    {base}

    It replaces whole files: right for an image whose code is at {before[:12]}.
    An image built from other code wants the patch instead.

What then
    Point the workload at the new image (its manifest, kubectl set image, docker run).
    The controller's own rollout (a Deployment's, a LeaderWorkerSet's) replaces each
    pod by one that runs the new image, and a container is recreated from it: the
    hot-fix in the old container goes with it, and the fix stays.
"""
