"""The agent's HTTP client (agent.py `_exchange`: a subset of HTTP/1.1 for the target's loopback, written there
rather than imported) reads what servers really send: a body by its Content-Length, in chunks, or to the
connection's end; an interim 1xx answer before the real one; and it says "no HTTP" rather than guess at an
answer cut short or not HTTP at all. Each server here is a real socket on 127.0.0.1 answering canned bytes."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from deployer.agent.client import AgentClient
from deployer.agent.protocol import Http
from deployer.transport.local import spawn_agent

CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"7\r\nmetric \r\n3;ext=1\r\n42\n\r\n0\r\n\r\n")
ANSWERS = {
    "/chunked": CHUNKED,
    "/to-the-end": b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + b"x" * 5000,
    "/interim": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
    "/no-content": b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
    "/not-http": b"SSH-2.0-OpenSSH_9.2\r\n",
    "/short": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
    "/cut-in-chunk": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc",
    "/silent": b"",
}


@pytest.fixture
def canned() -> Iterator[tuple[int, list[bytes]]]:
    """A server that answers each request's path with its canned bytes, then closes; and every request it read."""
    server = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    data = conn.recv(65536)
                    if not data:
                        break
                    request += data
                head, _, body = request.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    body += conn.recv(65536)
                seen.append(head + b"\r\n\r\n" + body)
                path = head.split(b" ")[1].decode() if head else ""
                conn.sendall(ANSWERS.get(path, b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], seen
    finally:
        server.shutdown(socket.SHUT_RDWR)  # wakes its accept (a close alone does not, on Linux)
        server.close()
        thread.join(5)
        assert not thread.is_alive()


@pytest.fixture
def client() -> Iterator[AgentClient]:
    with spawn_agent() as agent:
        yield agent


def test_a_chunked_body_is_joined_and_bounded(client: AgentClient, canned: tuple[int, list[bytes]]) -> None:
    port, _ = canned
    whole = client.http(f"http://127.0.0.1:{port}/chunked")
    assert (whole.status, whole.text, whole.truncated) == (200, "metric 42\n", False)
    assert whole.content_type == "text/plain"
    cut = client.http(f"http://127.0.0.1:{port}/chunked", max_bytes=8)
    assert (cut.text, cut.truncated) == ("metric 4", True)


def test_a_body_without_a_length_is_read_to_the_connections_end(client: AgentClient,
                                                                canned: tuple[int, list[bytes]]) -> None:
    port, _ = canned
    assert len(client.http(f"http://127.0.0.1:{port}/to-the-end").body) == 5000
    bounded = client.http(f"http://127.0.0.1:{port}/to-the-end", max_bytes=100)
    assert len(bounded.body) == 100 and bounded.truncated


def test_an_interim_answer_is_passed_over_and_an_empty_one_has_no_body(client: AgentClient,
                                                                       canned: tuple[int, list[bytes]]) -> None:
    port, _ = canned
    created = client.http(f"http://127.0.0.1:{port}/interim")
    assert (created.status, created.text) == (201, "ok")
    assert (client.http(f"http://127.0.0.1:{port}/no-content").status, ) == (204, )


@pytest.mark.parametrize(("path", "said"), [
    ("/not-http", "not an HTTP status line"),
    ("/short", "ended after 3 of its 10 bytes"),
    ("/cut-in-chunk", "ended inside a chunk"),
    ("/silent", "closed the connection without a response"),
])
def test_what_is_no_whole_http_answer_is_no_status_and_says_why(client: AgentClient, canned: tuple[int, list[bytes]],
                                                                path: str, said: str) -> None:
    port, _ = canned
    answer = client.http(f"http://127.0.0.1:{port}{path}")
    assert answer.status is None and said in (answer.error or ""), answer


def test_the_request_names_its_host_closes_its_connection_and_sends_its_json_with_its_length(
        client: AgentClient, canned: tuple[int, list[bytes]]) -> None:
    port, seen = canned
    client.call(Http(f"http://localhost:{port}/workers?x=1", method="POST", json={"url": "u"}, check=False))
    client.call(Http(f"http://127.0.0.1:{port}/workers", method="PUT", check=False))
    posted, put = seen
    assert posted.startswith(b"POST /workers?x=1 HTTP/1.1\r\n")
    for header in (f"Host: localhost:{port}", "Connection: close", "Content-Type: application/json",
                   "Content-Length: 12"):
        assert f"\r\n{header}\r\n".encode() in posted, (header, posted)
    assert posted.endswith(b'\r\n\r\n{"url": "u"}')
    assert b"\r\nContent-Length: 0\r\n" in put and b"Content-Type" not in put
