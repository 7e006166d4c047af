"""The options the commands share, and their shell completion: names read from the inventory and the runs
dir, never from a target."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from click.shell_completion import CompletionItem

F = TypeVar("F", bound=Callable[..., Any])


def complete_hosts(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from deployer.app.setting import Setting, inventory_of
    from deployer.errors import DeployerError

    try:
        inventory = inventory_of(Setting(inventory=ctx.params.get("inventory")))
    except DeployerError:
        return []
    names = [*inventory.hosts, *inventory.groups, *inventory.units]
    return [CompletionItem(name) for name in names if name.startswith(incomplete)]


def complete_runs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from deployer.app.runs import LAST, run_ids
    from deployer.app.setting import runs_dir_of

    names = [LAST, *run_ids(runs_dir_of(ctx.params.get("runs_dir")))]
    return [CompletionItem(name) for name in names if name.startswith(incomplete)]


def complete_states(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    from deployer.app.runs import FLEET_STATES, STATES
    return [CompletionItem(state) for state in dict.fromkeys((*STATES, *FLEET_STATES)) if state.startswith(incomplete)]


def host_option(required: bool = False, help: str = "Inventory host name.") -> Callable[[F], F]:
    return click.option("--host", "host_name", required=required, help=help, shell_complete=complete_hosts)


def inventory_option(func: F) -> F:
    return click.option("-i", "--inventory", type=click.Path(dir_okay=False), is_eager=True,
                        help="Inventory file (default $DEPLOYER_INVENTORY, then ./hosts.yaml).")(func)


def runs_dir_option(func: F) -> F:
    return click.option("--runs-dir", type=click.Path(file_okay=False), is_eager=True, callback=chosen_runs_dir,
                        help="Run log directory (default $DEPLOYER_RUNS_DIR, then ./.deployer/runs where there is "
                             "one, then $XDG_STATE_HOME/deployer/runs or ~/.local/state/deployer/runs).")(func)


def chosen_runs_dir(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    """The runs dir the command works in, decided once: the cwd's .deployer/runs is said to be the one (every
    other directory sees the user's history), except while completing, where a notice would garble the words."""
    from deployer.app.setting import runs_dir_of

    def notice(message: str) -> None:
        from deployer.ui.console import show_notice  # rich only for a command that has this to say
        show_notice(message)

    return str(runs_dir_of(value, None if ctx.resilient_parsing else notice))


def accept_option(func: F) -> F:
    return click.option("--accept-new-host-key", is_flag=True,
                        help="Pin an unknown SSH host key into known_hosts (a changed key is always refused).")(func)


def json_option(help: str = "Print one machine-readable JSON object (also on failure).") -> Callable[[F], F]:
    return click.option("--json", "as_json", is_flag=True, help=help)


def limit_option(func: F) -> F:
    return click.option("--limit", help="Narrow --host to the hosts this also names (same forms).",
                        shell_complete=complete_hosts)(func)


def health_timeout_option(func: F) -> F:
    return click.option("--health-timeout", "health_timeout_s", type=click.FloatRange(0, min_open=True),
                        metavar="S", help="Every service's health budget, in seconds, for this run only (instead of "
                        "the inventory's health_timeout_s); recorded in the run log.")(func)


def lock_wait_option(func: F) -> F:
    return click.option("--lock-wait", "lock_wait_s", type=click.FloatRange(0), default=0.0, metavar="S",
                        help="Wait up to S seconds for a deploy lock another run holds (polled, its holder shown) "
                             "instead of refusing at once (exit 3 when still held).")(func)


def parallel_option(func: F) -> F:
    return click.option("--parallel", type=click.IntRange(1, 1024), default=16, show_default=True,
                        help="Hosts worked on at once in a fleet run.")(func)


def follow_up_options(func: F) -> F:
    """What rollback and recover share: they act on a recorded run, one host or a fleet's, with its budgets."""
    for option in (health_timeout_option, accept_option, runs_dir_option, inventory_option, parallel_option):
        func = option(func)
    return func


def revert_check_options(func: F) -> F:
    """A rollback's say over the checks it runs on the reverted build (rollback, recover --rollback)."""
    func = click.option("--baseline", "baselines", multiple=True, metavar="METRIC=VALUE",
                        help="Judge the reverted build's METRIC against VALUE instead of the run's recorded "
                             "baseline (repeatable).")(func)
    return click.option("--skip-check", "skip_checks", multiple=True, metavar="NAME",
                        help="Leave the playbook's check NAME (a drain, a canary) out of this rollback; `all`: every "
                             "check after the restart (repeatable). The restart itself always runs.")(func)


def baselines_from(pairs: tuple[str, ...]) -> dict[str, float]:
    """Each --baseline METRIC=VALUE as metric -> value."""
    from deployer.errors import ConfigError

    given: dict[str, float] = {}
    for pair in pairs:
        metric, sep, value = pair.partition("=")
        try:
            given[metric.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not metric.strip():
            raise ConfigError(f"--baseline {pair!r}: write METRIC=VALUE, e.g. "
                              "--baseline sglang:num_prefill_inflight_queue_reqs=13")
    return given
