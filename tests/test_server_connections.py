"""Promise (issue 15 point 3): slow or idle connections are dropped. A connection that sends nothing, or
trickles its headers or its body, is closed within header_timeout_s / body_timeout_s (totals: trickling
does not extend them); an idle keep-alive connection within keep_alive_s; past max_connections a new
connection gets 503 JSON. Meanwhile other clients are served, and the log shows no traceback."""
import json
import select
import socket
import time
from urllib.parse import urlparse

import httpx
import pytest

from asap.server.process import ServerProcess

pytestmark = pytest.mark.timeout(180)
HEADER_S, BODY_S, KEEP_ALIVE_S, MAX_CONN = 1.5, 1.5, 1.0, 12
MARGIN_S = 1.5                                    # event-loop and scheduling slack on a loaded machine


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    args = ["tiny-deepseek-v3", "--engine", "reference", "--header-timeout-s", str(HEADER_S),
            "--body-timeout-s", str(BODY_S), "--keep-alive-s", str(KEEP_ALIVE_S), "--max-connections", str(MAX_CONN)]
    with ServerProcess(args, tmp_path_factory.mktemp("conn") / "server.log") as s:
        yield s
    assert "Traceback" not in s.log(), s.log()


def _connect(url: str) -> socket.socket:
    u = urlparse(url)
    sock = socket.create_connection((u.hostname, u.port), timeout=5)
    sock.setblocking(False)
    return sock


def _closed(sock: socket.socket) -> bool:
    """Has the server closed it? (EOF or reset; data it may have sent first is read and dropped)."""
    while select.select([sock], [], [], 0)[0]:
        try:
            if not sock.recv(65536):
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
    return False


def _trickle(sock: socket.socket, data: bytes) -> None:
    try:
        sock.send(data)
    except (BlockingIOError, ConnectionResetError, BrokenPipeError):
        pass


def test_slowloris_connections_are_dropped_and_other_clients_are_served(srv):
    t0 = time.monotonic()
    silent = [_connect(srv.url) for _ in range(3)]
    trickling = [_connect(srv.url) for _ in range(2)]                    # headers, a few bytes at a time
    slow_body = _connect(srv.url)
    slow_body.send(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                   b"content-length: 200\r\n\r\n{")
    header = b"GET /health HTTP/1.1\r\nhost: x\r\nx-padding: " + b"a" * 200
    closed_at: dict[int, float] = {}
    served = []
    with httpx.Client(base_url=srv.url, timeout=10) as client:
        i = 0
        while time.monotonic() - t0 < max(HEADER_S, BODY_S) + MARGIN_S + 1.0:
            for s in trickling:
                _trickle(s, header[i:i + 2])
            _trickle(slow_body, b" ")
            i += 2
            t = time.monotonic()
            served.append((client.get("/health").status_code, time.monotonic() - t))
            for s in [*silent, *trickling, slow_body]:
                if s.fileno() not in closed_at and _closed(s):
                    closed_at[s.fileno()] = time.monotonic() - t0
            time.sleep(0.1)
    for s in [*silent, *trickling, slow_body]:
        assert s.fileno() in closed_at, "a slow connection was never dropped"
        s.close()
    assert max(closed_at.values()) < max(HEADER_S, BODY_S) + MARGIN_S, closed_at
    assert min(closed_at.values()) > min(HEADER_S, BODY_S) - 0.2, closed_at       # not dropped early either
    assert {code for code, _ in served} == {200}
    assert max(t for _, t in served) < 1.0, served                                    # others were served


def test_idle_keep_alive_connection_is_closed(srv):
    sock = _connect(srv.url)
    sock.setblocking(True)
    sock.send(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    sock.setblocking(False)
    t0 = time.monotonic()
    while not _closed(sock) and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    took = time.monotonic() - t0
    sock.close()
    assert KEEP_ALIVE_S - 0.2 < took < KEEP_ALIVE_S + MARGIN_S, took


def test_connections_past_the_cap_get_503_json_until_the_slow_ones_are_dropped(srv):
    idle = [_connect(srv.url) for _ in range(MAX_CONN)]
    time.sleep(0.3)
    extra = _connect(srv.url)
    extra.setblocking(True)
    extra.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        chunk = extra.recv(65536)
        if not chunk:
            break
        data += chunk
    extra.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), data
    assert json.loads(body)["error"]["type"] == "overloaded_error"
    time.sleep(HEADER_S + MARGIN_S)                                  # the idle ones are dropped: room again
    with httpx.Client(base_url=srv.url, timeout=10) as client:
        assert client.get("/health").status_code == 200
    for s in idle:
        s.close()
