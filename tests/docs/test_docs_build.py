"""The documentation builds, strictly, and the README stays a front page that points into it.

The docs site (mkdocs.yml, docs/) is built here, in the test suite that .ci/run runs, so a broken link or anchor,
a page left out of the nav, or a reference page that no longer generates from the code (docs/gen_reference.py)
fails CI like any other test.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# The reference pages docs/gen_reference.py writes at build time: links to them have no file in the tree.
GENERATED = {f"docs/reference/{name}.md" for name in
             ("playbook", "inventory", "steps", "cli", "errors", "run-states", "events")}


def build(docs: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of a copy of the project's mkdocs.yml and docs/ (so a test may break the copy)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(docs / "mkdocs.yml"),
                           "-d", str(site)], capture_output=True, text=True, timeout=240, env=env)


def copy_of_docs(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", project / "docs")
    return project


def test_the_docs_build_in_strict_mode_with_every_reference_page_generated(tmp_path: Path) -> None:
    result = build(copy_of_docs(tmp_path), tmp_path / "site")
    assert result.returncode == 0, result.stderr
    for page in GENERATED:
        html = tmp_path / "site" / Path(page).relative_to("docs").with_suffix("") / "index.html"
        assert "Generated from the code" in html.read_text(), page
    # A sample of what the generator must find in the code, one per source.
    steps = (tmp_path / "site" / "reference" / "steps" / "index.html").read_text()
    assert "client_timeout_s" in steps and "abort_all_every" in steps  # the storm's parameters
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "--skip-check" in cli and "deployer rollback" in cli
    events = (tmp_path / "site" / "reference" / "events" / "index.html").read_text()
    assert "service_phase" in events and "rolled_back_by" in events
    # The README is no page of the site: its links into it are checked here, anchors included.
    for page, anchor in re.findall(r"\]\(docs/([^)#]+)\.md#([^)]+)\)", README.read_text()):
        html = tmp_path / "site" / ("" if page == "index" else page) / "index.html"
        assert f'id="{anchor}"' in html.read_text(), (page, anchor)


def test_a_broken_link_in_the_docs_fails_the_build(tmp_path: Path) -> None:
    project = copy_of_docs(tmp_path)
    page = project / "docs" / "how-to" / "rollback-checks.md"
    page.write_text(page.read_text() + "\nSee [the gone page](../nowhere.md).\n")
    result = build(project, tmp_path / "site")
    assert result.returncode != 0
    assert "nowhere.md" in result.stderr


def test_a_run_state_the_docs_do_not_explain_fails_the_build(tmp_path: Path) -> None:
    project = copy_of_docs(tmp_path)
    page = project / "docs" / "explanation" / "run-states.md"
    page.write_text(page.read_text().replace("`failed_committed`", "failed-committed"))
    result = build(project, tmp_path / "site")
    assert result.returncode != 0
    assert "run state 'failed_committed' is not explained" in result.stderr


def test_the_readme_is_a_front_page_under_200_lines() -> None:
    assert len(README.read_text().splitlines()) < 200


def test_every_link_of_the_readme_reaches_a_page_or_a_generated_one() -> None:
    text = README.read_text()
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links
    broken = [link for link in links if not link.startswith(("http://", "https://"))
              and not (ROOT / link).exists() and link not in GENERATED]
    assert not broken


def test_ci_runs_exactly_the_readmes_test_command() -> None:
    """The README's set-up commands are the whole set-up: CI runs its test command, and that command's extra
    brings the docs build (mkdocs, the Material theme, the generator's plugin)."""
    [line] = [line for line in README.read_text().splitlines() if "pip install -e '.[test]'" in line]
    install, test = (part.strip() for part in line.split("#")[0].split("&&"))
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert any(ci_line.strip() == test for ci_line in ci)
    assert any(ci_line.strip().replace(" -q", "") == install for ci_line in ci)
    pyproject = (ROOT / "pyproject.toml").read_text()
    [extra] = re.findall(r"^test = \[(.*?)\]$", pyproject, re.M | re.S)
    for package in ("mkdocs", "mkdocs-material", "mkdocs-gen-files"):
        assert f'"{package}>=' in extra, package


@pytest.mark.parametrize("page", sorted(GENERATED))
def test_a_generated_page_has_no_file_in_the_tree(page: str) -> None:
    """A file there would shadow the generated page and drift from the code."""
    assert not (ROOT / page).exists()
