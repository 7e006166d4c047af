"""Every `deployer ...` command line the README and the docs show names a real command and only its real options.

The lines are read from the code blocks of README.md and docs/**/*.md (fenced or indented); a line may list
alternatives (`runs show RUN_ID | runs verify RUN_ID`) and optional parts in brackets. The commands and their
options come from the click group itself, so a renamed command or a dropped option fails here, in the page
that still shows it.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from deployer.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def code_lines(text: str) -> list[str]:
    """The lines of a Markdown page's code blocks: fenced ones, and ones indented by four spaces."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            lines.append(line.strip())
    return lines


def shown_commands(text: str) -> list[list[str]]:
    """Each command a page shows, as words: comments, redirections and brackets taken off."""
    found = []
    for line in code_lines(text):
        line = re.sub(r"^#\s*", "", line) if line.startswith("# deployer") else line
        if not line.startswith("deployer "):
            continue
        line = line.split("  #")[0].split(" > ")[0]
        for number, alternative in enumerate(line.split(" | ")):
            words = [w.strip("[]") for w in alternative.split() if w.strip("[]") not in ("", "...")]
            found.append(words if number == 0 else ["deployer", *words])
    return found


def resolve(words: list[str]) -> tuple[click.Command, list[str]]:
    """The command the words name, and the words after its name."""
    command: click.Command = main
    rest = words[1:]
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        sub = command.get_command(click.Context(command), rest[0])
        if sub is None:
            break
        command, rest = sub, rest[1:]
    return command, rest


def problems(words: list[str]) -> list[str]:
    command, rest = resolve(words)
    if isinstance(command, click.Group):
        return [f"{' '.join(words)!r}: no command {rest[:1]} under {command.name!r}"]
    options = {name for param in command.params if isinstance(param, click.Option)
               for name in [*param.opts, *param.secondary_opts]} | {"--help"}
    return [f"{' '.join(words)!r}: {command.name} has no option {word.split('=')[0]}" for word in rest
            if word.startswith("-") and word.split("=")[0] not in options]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_a_page_shows_exists_with_the_options_it_shows(page: Path) -> None:
    found = [problem for words in shown_commands(page.read_text()) for problem in problems(words)]
    assert not found


def test_the_readme_shows_the_five_everyday_commands() -> None:
    shown = {resolve(words)[0].name for words in shown_commands((ROOT / "README.md").read_text())}
    assert {"check", "plan", "apply", "rollback", "recover"} <= shown


def test_a_command_or_option_that_does_not_exist_is_found() -> None:
    """The check itself can fail: a stale option, and a subcommand that is gone."""
    page = "    deployer rollback RUN_ID --skip-checks drain\n    deployer runs rewind RUN_ID\n"
    found = [p for words in shown_commands(page) for p in problems(words)]
    assert len(found) == 2 and "no option --skip-checks" in found[0] and "no command ['rewind']" in found[1]
