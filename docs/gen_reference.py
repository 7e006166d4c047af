"""The reference pages of the docs site, generated from the code at every build, so they cannot drift.

mkdocs-gen-files runs this file (mkdocs.yml: plugins.gen-files.scripts); `pages()` is pure and builds every page
as Markdown from what deployer itself declares:

- playbook and inventory fields: the pydantic models' JSON Schemas, descriptions included (`deployer schema`);
- step kinds: the step registry (deployer/steps/kinds.py), each kind's docstring, effect, scope and Params;
- CLI commands: the click group (deployer/cli/);
- exit codes: the typed failures of deployer/errors.py;
- run states: deployer/runstate.py's Phase and its transitions (and the shown names of deployer/run/shown.py);
- run-log event types: every event the package emits, found in its source.

It lives outside the package on purpose: the package never needs it, and only the docs build imports mkdocs.
Where a hand-written page explains what a generated one lists (exit codes, run states), the generator checks that
the hand-written page names every code and state the code has: a new one fails the strict build until it is
explained.
"""

from __future__ import annotations

import ast
import inspect
import io
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

import deployer

DOCS = Path(__file__).resolve().parent  # the hand-written pages the generated ones are checked against
PACKAGE = Path(deployer.__file__).resolve().parent  # the code the pages are generated from
GENERATED_NOTE = "*Generated from the code at build time (docs/gen_reference.py): edit the code, not this page.*\n"


class ReferenceError(Exception):
    """The code and a hand-written page disagree: the build must fail."""


# -- JSON Schema rendering ------------------------------------------------------------------------

def cell(text: str) -> str:
    """Text for one Markdown table cell: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def type_of(schema: dict[str, Any]) -> str:
    """A JSON Schema as a short type, with links to the models it names (their anchors on the same page)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema or "oneOf" in schema:
        choices = [type_of(s) for s in schema.get("anyOf", schema.get("oneOf", []))]
        return " or ".join(dict.fromkeys(c for c in choices if c))
    if "enum" in schema:
        return " | ".join(f"`{v}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    kind = schema.get("type")
    if kind == "array":
        return f"list of {type_of(schema.get('items', {})) or 'any'}"
    if kind == "object":
        extra = schema.get("additionalProperties")
        return f"map of {type_of(extra)}" if isinstance(extra, dict) and extra else "object"
    if kind is None:
        return "any"
    return "none" if kind == "null" else str(kind)


def default_of(spec: dict[str, Any], required: bool) -> str:
    if required:
        return "required"
    if "default" not in spec:
        return ""
    value = spec["default"]
    if value is None:
        return ""
    return f"`{value}`" if isinstance(value, str) and value else f"`{value!r}`"


def fields_table(model: dict[str, Any]) -> str:
    props: dict[str, Any] = model.get("properties", {})
    if not props:
        return "No fields.\n"
    required = set(model.get("required", []))
    rows = ["| field | type | default | description |", "|---|---|---|---|"]
    for name, spec in props.items():
        rows.append(f"| `{name}` | {cell(type_of(spec))} | {cell(default_of(spec, name in required))} | "
                    f"{cell(spec.get('description', ''))} |")
    return "\n".join(rows) + "\n"


def model_sections(schema: dict[str, Any], skip: set[str]) -> str:
    out = []
    for name, model in sorted(schema.get("$defs", {}).items()):
        if name in skip:
            continue
        out.append(f"### {name} {{ #{name.lower()} }}\n\n{cell(model.get('description', ''))}\n\n"
                   f"{fields_table(model)}")
    return "\n".join(out)


def config_page(kind: str, title: str, intro: str) -> str:
    from deployer.steps.kinds import KINDS
    from deployer.steps.schema import schema_for

    schema = schema_for(kind)
    # A playbook's step parameters have their own page, by kind.
    skip = {cls.Params.__name__ for cls in KINDS.values()} if kind == "playbook" else set()
    top = {"properties": dict(schema["properties"]), "required": schema.get("required", [])}
    if kind == "playbook":  # its items are every kind's params: a page of their own
        steps = schema["properties"]["steps"]
        said = steps.get("description", "") + " Each item: see [Step kinds](steps.md)."
        top["properties"]["steps"] = {"type": "array", "items": {"type": "string"}, "description": said}
    return (f"# {title}\n\n{GENERATED_NOTE}\n{intro}\n\n## Top level\n\n{fields_table(top)}\n"
            f"## Models\n\n{model_sections(schema, skip)}")


# -- step kinds -----------------------------------------------------------------------------------

def steps_page() -> str:
    from deployer.steps.kinds import KINDS
    from deployer.steps.optional import Ordered
    from deployer.steps.schema import summary

    out = ["# Step kinds\n", GENERATED_NOTE,
           "Each item of a playbook's `steps:` is a kind's name, or `{kind: {params}}`. The *effect* moves the "
           "run's state (see [Run states](run-states.md)); the *scope* says where the step runs when the host is "
           "one of a unit's. Ordering: in a playbook that uploads, a kind must come after the kinds in *after* "
           "and before those in *before*.\n"]
    for name, cls in KINDS.items():
        params = cls.Params.model_json_schema(ref_template="#/$defs/{model}")
        order = []
        after, before = (cls.after, cls.before) if issubclass(cls, Ordered) else ((), ())
        if after:
            order.append("after " + ", ".join(f"`{k}`" for k in after))
        if before:
            order.append("before " + ", ".join(f"`{k}`" for k in before))
        out.append(f"## `{name}` {{ #{name} }}\n\n{cell(summary(cls))}\n\n"
                   f"- effect: `{cls.effect.value}`\n- scope: `{cls.scope.value}`\n"
                   + (f"- order: {'; '.join(order)}\n" if order else "")
                   + f"\n{local_links(fields_table(params), name)}")
        for sub, model in sorted(params.get("$defs", {}).items()):
            out.append(f"#### {sub} (in `{name}`) {{ #{name}-{sub.lower()} }}\n\n{cell(model.get('description', ''))}"
                       f"\n\n{local_links(fields_table(model), name)}")
    return "\n".join(out)


def local_links(table: str, kind: str) -> str:
    """A kind's tables link to its own sub-models (two kinds may share one, and each lists it)."""
    return table.replace("](#", f"](#{kind}-")


# -- CLI ------------------------------------------------------------------------------------------

def commands(group: click.Group, ctx: click.Context) -> Iterator[tuple[click.Command, click.Context]]:
    for name in sorted(group.list_commands(ctx)):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        sub = click.Context(command, info_name=name, parent=ctx)
        yield command, sub
        if isinstance(command, click.Group):
            yield from commands(command, sub)


def param_row(param: click.Parameter) -> str:
    if isinstance(param, click.Option):
        names = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
        default = param.default
        unset = default is None or default is getattr(click.core, "UNSET", None) or callable(default)
        shown = "" if unset or param.is_flag or default in (False, ()) else f"`{default}`"
        kind = "flag" if param.is_flag else param.type.name
        multiple = " (repeatable)" if param.multiple else ""
        return f"| {names} | {cell(kind + multiple)} | {cell(shown)} | {cell(param.help or '')} |"
    nargs = "..." if param.nargs == -1 else ""
    required = "" if param.required else " (optional)"
    return f"| `{(param.name or '').upper()}{nargs}` | argument{required} | | |"


def cli_page() -> str:
    from deployer.cli import main

    root = click.Context(main, info_name="deployer")
    out = ["# Commands\n", GENERATED_NOTE, f"{cell(main.help or '')}\n", "```\n" + main.get_usage(root) + "\n```\n",
           f"{cell(main.epilog or '')}\n"]
    for command, ctx in commands(main, root):
        path = ctx.command_path
        out.append(f"## `{path}` {{ #{path.replace(' ', '-')} }}\n")
        out.append("```\n" + command.get_usage(ctx) + "\n```\n")
        out.append(inspect.cleandoc(command.help or "").replace("\b\n", "") + "\n")
        params = [p for p in command.get_params(ctx) if not (isinstance(p, click.Option) and p.name == "help")]
        if params:
            out.append("| option | type | default | help |\n|---|---|---|---|\n"
                       + "\n".join(param_row(p) for p in params) + "\n")
    return "\n".join(out)


# -- exit codes -----------------------------------------------------------------------------------

def failures() -> list[type[Exception]]:
    from deployer import errors

    return [cls for _, cls in inspect.getmembers(errors, inspect.isclass)
            if issubclass(cls, errors.DeployerError) and cls.__module__ == errors.__name__]


def exit_codes_page() -> str:
    hand = (DOCS / "reference" / "exit-codes.md").read_text()
    rows = ["| failure | exit code | what it means |", "|---|---|---|"]
    for cls in sorted(failures(), key=lambda c: (c.exit_code, c.__name__)):  # type: ignore[attr-defined]
        code = cls.exit_code  # type: ignore[attr-defined]
        if f"| {code} |" not in hand:
            raise ReferenceError(f"exit code {code} ({cls.__name__}) is not explained in docs/reference/exit-codes.md")
        rows.append(f"| `{cls.__name__}` | {code} | {cell(cls.__doc__ or '')} |")
    return ("# Failures and their exit codes\n\n" + GENERATED_NOTE
            + "\nEvery failure a person is meant to read is one of these types (deployer/errors.py); each carries the "
              "exit code the command ends with. What each code means for the target: [Exit codes](exit-codes.md).\n\n"
            + "\n".join(rows) + "\n")


# -- run states -----------------------------------------------------------------------------------

def comments(source: str) -> dict[str, str]:
    """NAME -> the comment that says what it is: the one on its line, else the comment lines right above it."""
    found: dict[str, str] = {}
    above: list[str] = []
    lines = source.splitlines()
    trailing = {tok.start[0]: tok.string.lstrip("# ") for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT and lines[tok.start[0] - 1].split("#")[0].strip()}
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if text.startswith("#"):
            above.append(text.lstrip("# "))
            continue
        if "=" in text and text.split("=")[0].strip().isidentifier():
            name = text.split("=")[0].strip()
            found[name] = trailing.get(number) or " ".join(above)
        above = []
    return found


def run_states_page() -> str:
    from deployer import runstate as state
    from deployer.run import shown

    Phase = state.Phase
    said = comments(inspect.getsource(state.Phase)) | comments(inspect.getsource(shown))
    hand = (DOCS / "explanation" / "run-states.md").read_text()
    for name in [*(p.value for p in state.TERMINAL), Phase.interrupted.value, shown.REFUSED, shown.FAILED,
                 shown.CANCELED]:
        if f"`{name}`" not in hand:
            raise ReferenceError(f"run state {name!r} is not explained in docs/explanation/run-states.md")
    rows = ["| state | terminal | meaning (from the code) |", "|---|---|---|"]
    for phase in Phase:
        terminal = "yes" if phase in state.TERMINAL else ""
        rows.append(f"| `{phase.value}` | {terminal} | {cell(said.get(phase.name, ''))} |")
    for name, value in (("REFUSED", shown.REFUSED), ("FAILED", shown.FAILED), ("CANCELED", shown.CANCELED)):
        rows.append(f"| `{value}` | yes (shown only) | {cell(said.get(name, ''))} |")
    phases = list(Phase)
    matrix = ["| from \\ to | " + " | ".join(f"`{p.value}`" for p in phases) + " |",
              "|---|" + "---|" * len(phases)]
    for old in phases:
        marks = " | ".join("✓" if state.allowed(old, new) else "" for new in phases)
        matrix.append(f"| `{old.value}` | {marks} |")
    return ("# Run states\n\n" + GENERATED_NOTE
            + "\nThe phases a run's `state.json` records (deployer/runstate.py), written before the remote effect of "
              "each transition. `refused` and `failed` are names `runs list` and `runs show` give a run that ended "
              "before changing anything (deployer/run/shown.py). What they mean for an operator, and how a cut run "
              "ends: [A run that can be cut anywhere](../explanation/run-states.md).\n\n"
            + "\n".join(rows)
            + "\n\nThe forward path: " + " → ".join(f"`{p.value}`" for p in state.FORWARD) + ".\n\n"
            + "## Allowed transitions\n\nA ✓ where the state machine lets a run move from the row's state to the "
              "column's (`allowed()`); anything else is refused as a bug.\n\n"
            + "\n".join(matrix) + "\n")


# -- run-log events -------------------------------------------------------------------------------

WRITERS = {"emit", "write", "record_run", "log_action"}  # the calls an event reaches the run log through


def call_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def dict_event(node: ast.AST) -> tuple[str, list[str]] | None:
    if not isinstance(node, ast.Dict):
        return None
    keys = {k.value: v for k, v in zip(node.keys, node.values, strict=True)
            if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    kind = keys.get("type")
    if isinstance(kind, ast.Constant) and isinstance(kind.value, str):
        return kind.value, [k for k in keys if k != "type"]
    return None


def events_in(tree: ast.AST) -> Iterator[tuple[str, list[str]]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and call_name(node) in WRITERS:
            if call_name(node) == "emit" and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                yield node.args[0].value, [k.arg for k in node.keywords if k.arg]
            for arg in node.args:
                for item in arg.elts if isinstance(arg, ast.List) else [arg]:
                    found = dict_event(item)
                    if found:
                        yield found
            for keyword in node.keywords:
                if keyword.arg == "event" and isinstance(keyword.value, ast.Constant):
                    yield str(keyword.value.value), []
        # The action kinds' events (steps/action.py's EVENT: a command, a get, an upload, ...).
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EVENT" for t in node.targets) \
                and isinstance(node.value, ast.Dict):
            for value in node.value.values:
                if isinstance(value, ast.Constant):
                    yield str(value.value), []


def events() -> dict[str, tuple[set[str], set[str]]]:
    """event type -> (fields seen where it is emitted, modules that emit it)."""
    found: dict[str, tuple[set[str], set[str]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent)
        if relative.parts[:2] == ("deployer", "demo") and "stack" in relative.parts:
            continue  # the demo's imitation of SGLang, not deployer
        for kind, fields in events_in(ast.parse(path.read_text(), str(path))):
            seen, where = found.setdefault(kind, (set(), set()))
            seen.update(fields)
            where.add(str(relative.with_suffix("")).replace("/", "."))
    if not found:
        raise ReferenceError(f"no run-log event found in {PACKAGE}: the scan no longer matches how events are emitted")
    return found


def events_page() -> str:
    rows = ["| event | fields set where it is emitted | emitted by |", "|---|---|---|"]
    for kind, (fields, where) in sorted(events().items()):
        rows.append(f"| `{kind}` | {cell(', '.join(f'`{f}`' for f in sorted(fields)))} | "
                    f"{cell(', '.join(f'`{m}`' for m in sorted(where)))} |")
    return ("# Run-log event types\n\n" + GENERATED_NOTE
            + "\nEvery line of a run's `events.jsonl` is one event: `seq`, `time`, `run`, `type`, the fields below, "
              "then `prev` and `line_sha256` (the hash chain; see [The run log](../explanation/anchored.md)). "
              "This list is read from deployer's source: each call that emits an event, with the fields it passes "
              "by name (an event built from a dict passed on whole lists only its literal keys). Every event also "
              "carries the host and, inside a step, the step.\n\n"
            + "\n".join(rows) + "\n")


# -- the pages ------------------------------------------------------------------------------------

def pages() -> dict[str, str]:
    return {
        "reference/playbook.md": config_page(
            "playbook", "Playbook fields",
            "The playbook model (`deployer schema playbook` prints it as JSON Schema). How these fields are checked "
            "when a playbook loads: [Playbook rules](playbook-rules.md)."),
        "reference/inventory.md": config_page(
            "inventory", "Inventory fields",
            "The inventory model, `hosts.yaml` (`deployer schema inventory` prints it as JSON Schema). A host's "
            "model is chosen by its `transport:` (`SshHost` by default, `LocalHost` for `transport: local`)."),
        "reference/steps.md": steps_page(),
        "reference/cli.md": cli_page(),
        "reference/errors.md": exit_codes_page(),
        "reference/run-states.md": run_states_page(),
        "reference/events.md": events_page(),
    }


def write() -> None:
    import mkdocs_gen_files

    for path, text in pages().items():
        with mkdocs_gen_files.open(path, "w") as handle:
            handle.write(text)


write()
