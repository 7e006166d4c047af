"""The signal handler of a single-host run: real signals, raised in this process."""

from __future__ import annotations

import signal
import threading

import pytest
from polling import within

from deployer.cli.running import cancel_on_signals
from deployer.fleet.runner import FleetCancel
from deployer.steps.cancel import CancelToken


def test_the_first_signal_cancels_and_the_second_stops_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    token = CancelToken()
    with cancel_on_signals(token):
        signal.raise_signal(signal.SIGINT)
        said = capsys.readouterr().err
        # Heard, not a failure: a notice (it was `error:`, beside a run that then ended well).
        assert token.cancelled and "notice: SIGINT: stopping at the next safe point (again to force)" in said, said
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)


def test_a_forced_stop_lets_a_restore_under_way_finish_and_the_next_one_stops_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    token = CancelToken()
    with cancel_on_signals(token):
        signal.raise_signal(signal.SIGINT)
        with token.undoing():
            signal.raise_signal(signal.SIGINT)  # held back: the restore goes on
            said = capsys.readouterr().err
            assert "putting the target back first, then stopping (again to abandon that)" in said, said
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGHUP)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back as it was


def test_a_forced_stop_is_held_back_once_per_run_not_once_per_restore() -> None:
    token = CancelToken()
    with cancel_on_signals(token):
        signal.raise_signal(signal.SIGINT)
        with token.undoing():
            signal.raise_signal(signal.SIGINT)
        with token.undoing(), pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)


def test_a_held_back_stop_still_kills_what_the_undo_waits_on_but_never_the_restores_own_commands() -> None:
    landing = threading.Event()
    token = CancelToken()
    with cancel_on_signals(token), token.undoing(kill=landing.set):
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # held back while landing: what it waits on is killed
        assert within(landing.is_set, 10)
    landing.clear()
    token = CancelToken()
    with cancel_on_signals(token), token.undoing(kill=landing.set), token.undoing(kill=None):  # the restore
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # held back during the restore: nothing of its own is killed
        assert not within(landing.is_set, 0.3)


def test_a_fleet_holds_a_forced_stop_back_while_any_host_puts_its_target_back() -> None:
    fleet = FleetCancel()
    host_a, host_b = fleet.child(), fleet.child()
    with cancel_on_signals(fleet):
        signal.raise_signal(signal.SIGINT)
        assert host_a.cancelled and host_b.cancelled
        with host_b.undoing():
            signal.raise_signal(signal.SIGINT)  # held back: host b is restoring
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)


def test_a_first_signal_during_a_rollback_says_it_goes_on_to_its_end_and_a_second_still_forces(
        capsys: pytest.CaptureFixture[str]) -> None:
    token = CancelToken()
    with cancel_on_signals(token), token.finishing_first("the rollback") as work:
        signal.raise_signal(signal.SIGINT)
        said = capsys.readouterr().err
        assert "SIGINT: the rollback goes on to its end first, then stops (again to force a stop halfway)" in said
        assert not work.cancelled  # what the rollback looks at
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)


def test_a_fleet_says_which_units_rollback_goes_on_to_its_end_while_it_does(
        capsys: pytest.CaptureFixture[str]) -> None:
    fleet = FleetCancel()
    fleet.child()
    host = fleet.child()
    with cancel_on_signals(fleet):
        with host.finishing_first("unit pd-1's rollback"):
            assert fleet.finishing() == "unit pd-1's rollback"
        assert fleet.finishing() is None  # that rollback ended: a later signal stops the rest as any other
        signal.raise_signal(signal.SIGINT)
        assert "SIGINT: stopping at the next safe point (again to force)" in capsys.readouterr().err


def test_a_fleet_rollback_host_token_is_never_cancelled_by_the_fleet_but_the_fleet_says_it_goes_on(
        capsys: pytest.CaptureFixture[str]) -> None:
    fleet = FleetCancel()
    host = fleet.finisher()  # `deployer rollback FLEET_ID`'s, and a fleet's own rollback after a signal
    with cancel_on_signals(fleet), host.finishing_first("unit pd-1's rollback"):
        signal.raise_signal(signal.SIGINT)
        assert "SIGINT: unit pd-1's rollback goes on to its end first" in capsys.readouterr().err
        assert not host.cancelled


def test_the_first_signal_says_which_running_steps_command_finishes_first(capsys: pytest.CaptureFixture[str]) -> None:
    from deployer.ui.console import line_console
    from deployer.ui.live import StepView

    view = StepView(line_console())
    for event in ({"type": "step_start", "step": "upload"}, {"type": "step_end", "step": "upload", "status": "ok"},
                  {"type": "step_start", "step": "remote_compile"}):
        view(event)
    assert view.running() == ["remote_compile"]
    token = CancelToken()
    with cancel_on_signals(token, view.running):
        signal.raise_signal(signal.SIGINT)
    # A first signal while a long command runs read as unheard: it is not what stops at the safe point.
    said = " ".join(capsys.readouterr().err.split())
    assert ("SIGINT: stopping at the next safe point (again to force): the command remote_compile runs now "
            "finishes first, then it stops") in said, said
