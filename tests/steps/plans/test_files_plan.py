"""The plans of the steps that ship the files: local_compile, upload and remote_compile, as exact actions."""

from __future__ import annotations

import hashlib
import sys

from planning import PYTHON, change, context, does, host, sha, step

from deployer.steps.action import Action
from deployer.steps.compile import INSTALL_SCRIPT
from deployer.steps.context import Change

A = change("pkg/a.py", b"x = 2\n")
NEW = change("pkg/new.py", b"y = 1\n", old=None, tracked=False)
CONF = change("conf/app.toml", b"k = 1\n")
# A playbook whose remote_compile comes before the reads and the commit: the upload only stages the files.
STAGING = ("local_compile", "upload", "remote_compile", "diff_bounds", "commit")
# One whose remote_compile comes after the commit: the upload writes the live files, and they are compiled there.
LIVE = ("upload", "diff_bounds", "commit", "remote_compile")
GIT = ("git", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "--literal-pathspecs")


def staged(dest: str, new: bytes) -> str:
    """Where the upload stages new bytes for dest: beside it, named by the dest and the bytes alone."""
    folder, _, name = f"/srv/app/{dest}".rpartition("/")
    return f"{folder}/.{name}.deployer-staged-{hashlib.sha256(new).hexdigest()[:16]}.tmp"


def test_local_compile_plans_one_local_compile_per_python_file_and_nothing_on_the_target() -> None:
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert does(step("local_compile").plan(context(changes=[A, NEW, CONF]))) == does([
        Action(f"compile pkg/a.py here (Python {version})", key="compile:pkg/a.py"),
        Action(f"compile pkg/new.py here (Python {version})", key="compile:pkg/new.py")])


def test_local_compile_plans_nothing_without_python_files() -> None:
    assert step("local_compile").plan(context(changes=[CONF])) == []


def test_upload_writes_each_file_whole_at_its_dest_when_it_is_compiled_live() -> None:
    assert does(step("upload").plan(context(changes=[A, NEW, CONF], steps=LIVE))) == does([
        Action.put("write:pkg/a.py", f"write pkg/a.py (6 bytes, sha256 {sha(A.new)}) via temp file + sha256 check "
                   "+ rename", "/srv/app/pkg/a.py"),
        Action.put("write:pkg/new.py", f"write pkg/new.py (6 bytes, sha256 {sha(NEW.new)}) via temp file + sha256 "
                   "check + rename", "/srv/app/pkg/new.py"),
        Action.put("write:conf/app.toml", f"write conf/app.toml (6 bytes, sha256 {sha(CONF.new)}) via temp file + "
                   "sha256 check + rename", "/srv/app/conf/app.toml")])


def test_upload_stages_each_file_beside_its_dest_when_remote_compile_comes_before_the_commit() -> None:
    def stage(c: Change) -> Action:
        return Action.put(f"stage:{c.dest}", f"stage {c.dest} ({len(c.new)} bytes, sha256 {sha(c.new)}) beside it, "
                          "owner and mode set, sha256 checked; remote_compile compiles it, then renames it into place",
                          f"/srv/app/{c.dest}", stage=staged(c.dest, c.new))
    assert does(step("upload").plan(context(changes=[A, CONF], steps=STAGING))) == does([stage(A), stage(CONF)])


def test_upload_writes_in_place_when_remote_compile_comes_after_the_commit() -> None:
    plan = step("upload").plan(context(changes=[A], steps=LIVE))
    assert [(a.key, a.target, a.stage) for a in plan] == [("write:pkg/a.py", "/srv/app/pkg/a.py", "")]


def test_upload_of_a_patch_checks_then_applies_it_then_reads_each_file_back() -> None:
    assert does(step("upload").plan(context(changes=[A, CONF], patch=b"--- a/pkg/a.py\n", steps=STAGING))) == does([
        Action.run("apply_check", "check the patch applies (patch on stdin)", (*GIT, "apply", "--check", "-"),
                   "/srv/app", failure="the patch does not apply to the target's tree"),
        Action.run("apply", "apply the patch (patch on stdin), then give the files back their owner and mode",
                   (*GIT, "apply", "-"), "/srv/app", failure="git apply failed"),
        Action.get("verify:pkg/a.py", "read pkg/a.py back", "/srv/app/pkg/a.py"),
        Action.get("verify:conf/app.toml", "read conf/app.toml back", "/srv/app/conf/app.toml")])


def test_remote_compile_compiles_the_live_python_files_under_the_hosts_python() -> None:
    plan = step("remote_compile").plan(context(changes=[A, NEW, CONF], steps=LIVE))
    assert does(plan) == does([Action.run("compile", "compile on the target",
                               (PYTHON, "-I", "-S", "-c", INSTALL_SCRIPT, "2", "pkg/a.py", "pkg/new.py"), "/srv/app",
                               failure=f"the target's {PYTHON} cannot compile the shipped files")])


def test_remote_compile_compiles_the_staged_temps_then_renames_every_staged_file_into_place() -> None:
    plan = step("remote_compile").plan(context(changes=[A, NEW, CONF], steps=STAGING))
    a, new, conf = (staged(c.dest, c.new) for c in (A, NEW, CONF))
    assert does(plan) == does([Action.run(
        "compile", "compile the staged files on the target, then, only if all compiled, rename them into place "
        "(owner and mode set when staged)",
        (PYTHON, "-I", "-S", "-c", INSTALL_SCRIPT, "2", a, new,
         a, "/srv/app/pkg/a.py", new, "/srv/app/pkg/new.py", conf, "/srv/app/conf/app.toml"), "/srv/app",
        failure=f"the target's {PYTHON} cannot compile the shipped files; none of them was installed")])


def test_remote_compile_only_installs_staged_files_when_none_is_python() -> None:
    conf = staged(CONF.dest, CONF.new)
    assert does(step("remote_compile").plan(context(changes=[CONF], steps=STAGING))) == does([Action.run(
        "install", "rename the staged files into place (owner and mode set when staged)",
        (PYTHON, "-I", "-S", "-c", INSTALL_SCRIPT, "0", conf, "/srv/app/conf/app.toml"), "/srv/app",
        failure="cannot rename the staged files into place")])


def test_remote_compile_plans_nothing_on_the_target_for_a_patch_without_python_files() -> None:
    plan = step("remote_compile").plan(context(changes=[CONF], patch=b"--- a/conf/app.toml\n", steps=STAGING))
    assert does(plan) == does([Action("no Python files to compile")])


def test_remote_compile_uses_the_python_the_host_names() -> None:
    [compile_] = step("remote_compile").plan(context(host(python="/usr/bin/python3.12"), changes=[A],
                                                     steps=LIVE))
    assert compile_.argv[:4] == ("/usr/bin/python3.12", "-I", "-S", "-c")
    assert compile_.failure == "the target's /usr/bin/python3.12 cannot compile the shipped files"
