"""Secrets that need shell quoting are masked in every quoted form a command line or its echo gives them."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Iterator

from fixtures_services import Stack

SPACED, QUOTED = "p@ss word", "it's"
# Each way these two stand on a command line or in its echo, written out here rather than taken from the
# code under test: raw, shell-quoted whole or as part of a word (both idioms for a quote), backslashed.
FORMS = [SPACED, "p@ss\\ word", QUOTED, "'it'\"'\"'s'", "it'\"'\"'s", "it'\\''s", "it\\'s"]

ECHO = """import json, shlex, sys
print(shlex.join(sys.argv[1:]))  # the way xtrace and most loggers echo a command line
print(json.dumps(sys.argv[1:]))
sys.exit(3)
"""


def readings(text: str, depth: int = 3) -> Iterator[str]:
    """text, and each word a shell would make of each of its lines, again for words that are scripts
    (`sh -c '...'` quoted once more inside a logged line): a secret quoted any number of times shows up raw."""
    yield text
    if depth:
        for line in text.splitlines():
            try:
                words = shlex.split(line)
            except ValueError:  # not a shell line
                continue
            for word in words:
                yield from readings(word, depth - 1)


def strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def test_secrets_with_a_space_or_a_quote_are_masked_in_their_quoted_forms_in_logged_commands(stack: Stack) -> None:
    project = stack.project
    echo = project.write("echo_argv.py", ECHO)
    # A shell line as an operator writes one: the secrets are quoted in it, so the raw value never appears there.
    start = ["sh", "-c", f"exec {sys.executable} {echo} --pw='p@ss word' --quote='it'\\''s' \"--dq=it's\""]
    leaky = {"start": start, "health": "http://127.0.0.1:9/health", "health_timeout_s": 20,
             "env": {"DB_PASSWORD": {"secret": True, "value": SPACED}, "QUOTE": {"secret": True, "value": QUOTED}}}
    stack.configure(prefill=leaky)
    project.playbook(steps=["co_restart"])
    result = project.deployer("apply", "fix.yaml", "--host", "box")
    assert result.returncode != 0 and "service prefill" in result.stderr, result.stdout + result.stderr
    assert "--pw=" in result.stderr and "--quote=" in result.stderr  # the echoed line is shown ...
    logs = list(project.runs.rglob("events.jsonl"))
    events = [json.loads(line) for log in logs for line in log.read_text().splitlines()]
    assert any("sh -c" in e.get("command", "") and "--pw=" in e["command"] for e in events)  # ... and the start
    texts = [("stdout", result.stdout), ("stderr", result.stderr), *(("events.jsonl", t) for t in strings(events)),
             *(("events.jsonl raw", log.read_text()) for log in logs)]
    for where, text in texts:  # ... command is logged, with neither secret in any form, however often quoted
        leaked = {form for reading in readings(text) for form in FORMS if form in reading}
        assert not leaked, f"{where} holds {sorted(leaked)}:\n{text}"
