"""pods/exec: the bridge between one upgraded WebSocket and the `podman exec` process it runs."""

from __future__ import annotations

import contextlib
import subprocess
import threading
from typing import Any

from . import websocket
from .objects import Json, dumps


def bridge(connection: websocket.Connection, argv: list[str], command: list[str], env: dict[str, str],
             stdin: bool, stdout: bool, stderr: bool) -> None:
    """Bridge one exec: stdin frames into the process, its output out as frames, then its exit as a Status."""
    process = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                               stdout=subprocess.PIPE if stdout else subprocess.DEVNULL,
                               stderr=subprocess.PIPE if stderr else subprocess.DEVNULL)

    def pump(stream: Any, channel: int) -> None:
        while chunk := stream.read1(65536):
            connection.send_channel(channel, chunk)

    pumps = [threading.Thread(target=pump, args=(stream, channel), daemon=True)
             for stream, channel in ((process.stdout, websocket.STDOUT), (process.stderr, websocket.STDERR))
             if stream is not None]
    for thread in pumps:
        thread.start()
    reader = threading.Thread(target=_from_client, args=(connection, process), daemon=True)
    reader.start()
    code = process.wait()
    for thread in pumps:
        thread.join()
    if code == 0:
        status: Json = {"metadata": {}, "status": "Success"}
    else:
        status = {"metadata": {}, "status": "Failure",
                  "message": f"command terminated with non-zero exit code: error executing command {command}, "
                             f"exit code {code}",
                  "reason": "NonZeroExitCode", "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}
    try:
        connection.send_channel(websocket.STATUS, dumps(status))
        connection.close()
    except OSError:
        pass
    reader.join(timeout=5)


def _from_client(connection: websocket.Connection, process: subprocess.Popen[bytes]) -> None:
    """Client frames: stdin into the process (until v5 closes it, or the connection ends), pings answered."""
    sink = process.stdin
    try:
        while True:
            frame = connection.receive()
            if frame.opcode == websocket.OP_CLOSE:
                connection.close()
                return
            if frame.opcode == websocket.OP_PING:
                connection.send(websocket.OP_PONG, frame.payload)
            elif frame.opcode == websocket.OP_BINARY and frame.payload:
                channel, data = frame.payload[0], frame.payload[1:]
                if channel == websocket.STDIN and sink is not None and data:
                    try:
                        sink.write(data)
                        sink.flush()
                    except BrokenPipeError:  # the command stopped reading: the rest of stdin goes nowhere
                        sink = None
                elif (channel == websocket.CLOSE_STREAM and connection.protocol == websocket.PROTOCOLS[0]
                      and data[:1] == bytes([websocket.STDIN]) and sink is not None):
                    sink.close()
                    sink = None
    except (EOFError, OSError, ValueError):
        return
    finally:
        if sink is not None:
            with contextlib.suppress(BrokenPipeError):
                sink.close()
