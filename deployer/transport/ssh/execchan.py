"""An exec on an SSH channel whose answer is not waited for: what is written next follows the request at once.

paramiko's exec_command sends the request and waits for sshd's answer before anything else goes out: a round
trip on every agent's start. sshd takes a channel's requests and its data in order, so the agent's source can
follow the request at once and the answer come back meanwhile. The answer is still read: a refused exec closes
the channel, and the pipe's first read then says it was refused (not that an agent was lost); one unanswered
past connect_timeout closes the connection, as a target that stopped answering (a partition, a frozen sshd)
would otherwise hang the run, and every waiter then fails at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, cast

from deployer.agent.client import NeverStarted
from deployer.transport.pipes import ChannelPipe
from deployer.transport.ssh.paramiko_lean import paramiko


class ExecPipe(ChannelPipe):
    """line run on channel (the exec sent now), as the agent's pipe; its end before the first byte is
    NeverStarted with the reason, when the exec was refused, went unanswered or its connection was lost."""

    _chan: paramiko.Channel

    def __init__(self, channel: paramiko.Channel, line: str, *, name: str, where: str, timeout_s: float,
                 kill: Callable[[], None] | None = None) -> None:
        super().__init__(channel)
        self._kill = kill  # ends the exec's process group from elsewhere (close(kill=True))
        self._name, self._where, self._timeout_s = name, where, timeout_s
        self._started = False
        self._unanswered = False
        request = paramiko.Message()
        request.add_byte(paramiko.common.cMSG_CHANNEL_REQUEST)
        request.add_int(channel.remote_chanid)
        request.add_string("exec")
        request.add_boolean(True)  # an answer, success or failure
        request.add_string(line)
        channel.event.clear()  # what exec_command does before it sends (paramiko's Channel._event_pending)
        channel.event_ready = False
        cast(Any, channel.transport)._send_user_message(request)
        threading.Thread(target=self._watch, name=f"exec-answer-{name}", daemon=True).start()

    def close(self, kill: bool = False) -> None:
        if kill and self._kill is not None:
            self._kill()  # before the close: the channel's end is no news to a python that never reads
        super().close(kill)

    def _watch(self) -> None:
        if not self._chan.event.wait(self._timeout_s):
            self._unanswered = True
            transport = self._chan.get_transport()
            if transport is not None:
                transport.close()

    def read(self, size: int) -> bytes:
        data = super().read(size)
        if data:
            self._started = True
        elif not self._started and (why := self._never_started()) is not None:
            raise NeverStarted(f"{self._name}: could not start the agent: {why}")
        return data

    def _never_started(self) -> str | None:
        if self._unanswered:
            return f"no answer to its exec from {self._where} within {self._timeout_s:g}s"
        transport = self._chan.get_transport()
        if transport is None or not transport.is_active():
            return f"the SSH connection to {self._where} was lost"
        if self._chan.event.is_set() and not self._chan.event_ready:
            return f"the SSH server at {self._where} refused the exec request"
        return None
