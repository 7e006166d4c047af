"""`deployer demo` from a normal (non-editable) install: what the demo needs ships inside the wheel.

This runs in CI like every other test: it builds a wheel of this tree, installs it into a fresh
venv (which borrows the already installed dependencies through --system-site-packages, so nothing
is downloaded but the build backend) and runs the installed `deployer demo` from an unrelated directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
    # --ignore-installed: the editable install of the dev tree is visible through the system site-packages.
    installed = run(py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed", wheel,
                    cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr
    # Nothing of this source tree may leak in: no PYTHONPATH, and a working directory outside it.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"NO_COLOR": "1"}
    where = run(py, "-c", "import deployer; print(deployer.__file__)", cwd=tmp_path, env=env)
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr
    demo = run(venv / "bin" / "deployer", "demo", "--workdir", tmp_path / "demo", "--json", cwd=tmp_path, env=env)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert '"status": "successful"' in demo.stdout
