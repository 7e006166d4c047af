"""Every step kind of the registry, and every service manager co_restart may use, has its plan checked as data
here: a new kind (or manager) without a `test_<kind>_...` beside these fails this test."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

from planning import DOES, SHOWN

from deployer.steps.action import Action
from deployer.steps.kinds import KINDS
from deployer.steps.services import MANAGERS

HERE = Path(__file__).parent


def planned_tests() -> set[str]:
    """The test functions of this folder's plan modules (read, not imported)."""
    return {node.name for path in HERE.glob("test_*_plan.py") for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_registered_step_kind_has_a_plan_test() -> None:
    tests = planned_tests()
    missing = [kind for kind in KINDS if not any(name.startswith(f"test_{kind}_") for name in tests)]
    assert len(KINDS) >= 10 and not missing, f"no test_<kind>_... in {HERE} for: {', '.join(missing)}"


def test_every_service_manager_has_a_co_restart_plan_test() -> None:
    tests = planned_tests()
    names = [m.__name__.removesuffix("Manager").lower() for m in MANAGERS]
    missing = [name for name in names if not any(t.startswith(f"test_co_restart_{name}_") for t in tests)]
    assert names and not missing, f"no test_co_restart_<manager>_... in {HERE} for: {', '.join(missing)}"


def test_every_field_of_an_action_is_either_compared_or_only_shown() -> None:
    # A new field is either what the run does (planning.DOES: compared by every test here) or how a plan is
    # shown (planning.SHOWN): said there, so that no new behaviour escapes these tests unnoticed.
    have = {f.name for f in fields(Action)}
    assert set(DOES) <= have, set(DOES) - have
    assert have <= set(DOES) | set(SHOWN), have - set(DOES) - set(SHOWN)
