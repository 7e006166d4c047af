"""A local port tunnelled to the target: a 127.0.0.1 listener whose connections each become an SSH channel."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

from deployer.transport.ssh.paramiko_lean import paramiko

CHUNK = 65536


class Forward:
    """A 127.0.0.1 listener whose connections each become a direct-tcpip channel."""

    def __init__(self, transport: paramiko.Transport, remote_host: str, remote_port: int,
                 timeout: float) -> None:
        self._transport = transport
        self._remote = (remote_host, remote_port)
        self._timeout = timeout
        self._lock = threading.Lock()
        self._open: set[socket.socket | paramiko.Channel] = set()  # closed on stop
        self.stopped = False
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        # Polling as well as close()'s shutdown: shutdown wakes accept() on Linux, not everywhere.
        self._listener.settimeout(0.25)
        self.local_port: int = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept_loop, daemon=True,
                         name=f"forward-{self.local_port}").start()

    def _accept_loop(self) -> None:
        while not self.stopped:
            try:
                client, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                self.stopped = True  # a dead listener must not be handed out again by forward()
                break
            threading.Thread(target=self._serve, args=(client, peer), daemon=True).start()

    def _serve(self, client: socket.socket, peer: tuple[str, int]) -> None:
        client.settimeout(None)
        try:
            chan = self._transport.open_channel("direct-tcpip", self._remote, peer,
                                                timeout=self._timeout)
        except (paramiko.SSHException, OSError, EOFError):
            client.close()  # the target refused; the local client sees a closed connection
            return
        with self._lock:
            if self.stopped:
                close_quietly(chan)
                client.close()
                return
            self._open.update((client, chan))
        done = threading.Semaphore(0)

        def abort() -> None:
            # One direction failed: end the other too instead of leaving it blocked in recv().
            _shutdown(client, socket.SHUT_RDWR)
            close_quietly(chan)

        threading.Thread(target=self._pump, daemon=True,
                         args=(client.recv, chan.sendall, chan.shutdown_write, abort, done)).start()
        self._pump(chan.recv, client.sendall, lambda: _shutdown(client, socket.SHUT_WR), abort, done)
        done.acquire()
        done.acquire()
        with self._lock:
            self._open.discard(client)
            self._open.discard(chan)
        close_quietly(chan)
        client.close()

    @staticmethod
    def _pump(recv: Callable[[int], bytes], send: Callable[[bytes], object],
              eof: Callable[[], object], abort: Callable[[], None], done: threading.Semaphore) -> None:
        """Copy one direction; pass a clean end-of-stream on as a half-close."""
        try:
            while data := recv(CHUNK):
                send(data)
            eof()
        except (OSError, EOFError, paramiko.SSHException):
            abort()
        finally:
            done.release()

    def close(self) -> None:
        with self._lock:
            self.stopped = True
            pending = list(self._open)
            self._open.clear()
        # shutdown, unlike close, stops listening at once and wakes threads blocked in
        # accept() or recv() on these sockets.
        _shutdown(self._listener, socket.SHUT_RDWR)
        self._listener.close()
        for item in pending:
            if isinstance(item, socket.socket):
                _shutdown(item, socket.SHUT_RDWR)
            close_quietly(item)


def close_quietly(item: socket.socket | paramiko.Channel) -> None:
    # A channel on a dead connection raises EOFError on close; it is closed all the same.
    with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
        item.close()


def _shutdown(sock: socket.socket, how: int) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(how)
