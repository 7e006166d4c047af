"""A new step kind is one module and one registry line: a kind with only the core (kind, Params, effect, scope,
plan, run), defined in this module and registered for the test alone, is loaded from a playbook, planned, and
applied by the engine's own loop over the in-memory agent, between a real fix's upload and its commit. It opts
into none of steps/optional.py's protocols, so the run asks each of them and gets the defaults."""

from __future__ import annotations

import sys

import pytest
from fixtures_memory import MemoryTarget, MemoryTransport
from fixtures_repo import FIXED_A, git

from deployer.config.models import Host, Strict
from deployer.run.engine import Engine
from deployer.steps.base import Action, Step
from deployer.steps.context import Context, EventBus
from deployer.steps.kinds import KINDS, WHERE
from deployer.steps.playbook import load_playbook


class GreetParams(Strict):
    word: str = "hello"


class Greet(Step):
    """Says a word on the target, in its repo."""

    kind = "greet"
    Params = GreetParams
    params: GreetParams

    def plan(self, ctx: Context) -> list[Action]:
        return [Action.run("greet", f"say {self.params.word} on the target", ("echo", self.params.word), ctx.repo,
                           failure="the target did not answer")]

    def run(self, ctx: Context) -> str:
        return f"said {ctx.act(self.plan(ctx)[0], timeout=self.timeout_s).out.strip()}"


def engine(memory_target: MemoryTarget) -> Engine:
    fix = memory_target.root / "fix"
    fix.mkdir()
    (fix / "a.py").write_text(FIXED_A)
    (fix / "fix.yaml").write_text("name: greet\nfiles:\n  - {src: a.py, dest: pkg/a.py}\n"
                                  "steps:\n  - upload\n  - greet: {word: bonjour}\n  - commit: {message: the fix}\n")
    loaded, steps = load_playbook(fix / "fix.yaml")

    def connect(bus: EventBus) -> MemoryTransport:
        transport = MemoryTransport()
        memory_target.transports.append(transport)
        return transport

    return Engine(host_name="memory", host=Host.model_validate({"repo": str(memory_target.repo), "transport": "local",
                                                                "python": sys.executable}),
                  connect=connect, playbook=loaded, steps=steps, runs_dir=memory_target.root / "runs",
                  listeners=[memory_target.events.append])


def test_a_kind_with_only_the_core_is_registered_by_one_line_then_planned_and_applied_by_the_engine(
        monkeypatch: pytest.MonkeyPatch, memory_target: MemoryTarget) -> None:
    monkeypatch.setitem(WHERE, "greet", (__name__, "Greet"))  # the one registry line
    made = engine(memory_target)
    assert [type(s).__name__ for s in made.steps] == ["Upload", "Greet", "Commit"]

    planned = dict(made.plan().steps)
    assert [a.argv for a in planned["greet"]] == [("echo", "bonjour")]

    result = made.apply()
    assert (result.status, result.error) == ("successful", None)
    greeted = memory_target.of("step_end", lambda e: e["step"] == "greet")
    assert [e["summary"] for e in greeted] == ["said bonjour"]
    assert (memory_target.repo / "pkg/a.py").read_text() == FIXED_A
    assert git(memory_target.repo, "log", "-1", "--format=%s").startswith("the fix")

    monkeypatch.undo()  # the line gone, so is the kind
    assert "greet" not in KINDS


def test_what_every_step_has_is_its_core_and_nothing_more() -> None:
    # Anything more (checking the host, judging early, reading live, reaching routers...) is a protocol of
    # steps/optional.py that a kind opts into: a new kind's author reads base.py.
    assert {name for name in dir(Greet) if not name.startswith("_")} == {
        "kind", "Params", "effect", "scope", "plan", "run", "describe"}
