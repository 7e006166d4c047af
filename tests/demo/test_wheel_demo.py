"""`deployer demo` from a normal (non-editable) install: what the demo needs ships inside the wheel.

This runs in CI like every other test: it builds a wheel of this tree, installs it into a fresh
venv (which borrows the dependencies installed for the interpreter running the tests, so nothing
is downloaded but the build backend) and runs the installed `deployer demo` from an unrelated directory.
Run from inside a virtualenv, that interpreter's packages are the virtualenv's, not the base Python's.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

from fixtures_services import wait_dead

from deployer.demo.run import process_alive

REPO = Path(__file__).resolve().parents[2]


def run(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_the_demo_runs_from_an_installed_wheel(tmp_path: Path) -> None:
    built = run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp_path / "dist", REPO, cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "dist").glob("deployer-*.whl"))
    venv = tmp_path / "venv"
    made = run(sys.executable, "-m", "venv", "--system-site-packages", venv, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    py = venv / "bin" / "python"
    borrow_the_running_interpreters_packages(py)
    # --ignore-installed: the editable install of the dev tree is visible through the system site-packages.
    installed = run(py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed", wheel,
                    cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr
    # Nothing of this source tree may leak in: no PYTHONPATH, and a working directory outside it.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"NO_COLOR": "1"}
    where = run(py, "-c", "import deployer; print(deployer.__file__)", cwd=tmp_path, env=env)
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr
    deployer = venv / "bin" / "deployer"
    # No --workdir: the demo makes its own temp dir, and `demo --stop` must find it there alone.
    (tmp_path / "tmp").mkdir()
    env["TMPDIR"] = str(tmp_path / "tmp")
    demo = run(deployer, "demo", "--keep", cwd=tmp_path, env=env)
    workdir = next((tmp_path / "tmp").glob("deployer-demo-*"), None)
    assert demo.returncode == 0 and workdir is not None, demo.stdout + demo.stderr
    state = workdir / "repo" / ".git" / "deployer"
    pids = {p.stem: int(p.read_text()) for p in state.glob("*.pid")}
    try:
        assert demo.returncode == 0, demo.stdout + demo.stderr
        report = demo.stdout[demo.stdout.index("demo report"):]
        assert_chart(report)
        assert f"stop it with: deployer demo --stop --workdir {workdir}" in report
        assert set(pids) == {"prefill", "decode", "router"} and all(process_alive(p) for p in pids.values())
        run_id = next((workdir / "runs").iterdir()).name
        shown = run(deployer, "runs", "show", run_id, "--runs-dir", workdir / "runs", cwd=tmp_path, env=env)
        assert_chart(shown.stdout)
        stopped = run(deployer, "demo", "--stop", "--json", cwd=tmp_path, env=env)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert json.loads(stopped.stdout)["stopped"] == {str(workdir): pids}
        assert all(wait_dead(pid) for pid in pids.values())
        assert json.loads(stopped.stdout)["removed"] == [str(workdir)] and not workdir.exists()
        again = run(deployer, "demo", "--stop", "--workdir", workdir, "--json", cwd=tmp_path, env=env)
        # Its files went with its stack: nothing of a demo is there any more.
        assert again.returncode == 2 and f"{workdir} holds no demo" in json.loads(again.stdout)["error"]
    finally:
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def borrow_the_running_interpreters_packages(py: Path) -> None:
    """--system-site-packages borrows the *base* interpreter's site-packages: inside a virtualenv that is not
    where the dependencies are. A .pth line puts the running interpreter's own (a venv's or the base's) after
    the new venv's, so the wheel installed there comes first."""
    site = run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=py.parent)
    assert site.returncode == 0, site.stderr
    borrowed = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (Path(site.stdout.strip()) / "borrowed-test-deps.pth").write_text("".join(f"{p}\n" for p in borrowed))


def assert_chart(text: str) -> None:
    """The baseline and drain samples drawn as bars, plain text (no terminal here), the bound marked."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("samples (one bar per poll"))
    baseline, drain, marks = lines[start + 1], lines[start + 2], lines[start + 3]
    assert baseline.split()[0] == "baseline" and drain.split()[0] == "drain"
    assert set(baseline.split()[1]) <= set("▁▂▃▄▅▆▇█") and set(drain.split()[1]) <= set("▁▂▃▄▅▆▇█")
    assert marks.strip().endswith("✓ = <= 0") and marks.split()[0].endswith("✓✓✓")
    assert "\x1b[" not in text
