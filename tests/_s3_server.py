"""Test fixtures: a real S3 server on loopback and a fault-injecting TCP proxy in front of it.

``MotoS3Server`` runs moto's S3 server in a child process (its own GIL, like a real server) bound to
127.0.0.1 on a free port; it stops when the fixture closes it (or when the test process dies, because
the child exits when its stdin closes).

``FaultProxy`` is a plain TCP proxy on 127.0.0.1 that, at a seeded rate, per HTTP request, does one of
(in turn):

* ``reset``: closes the client connection with an RST before forwarding the request;
* ``503``: answers ``503 SlowDown`` itself (what S3 sends when it throttles);
* ``429``: answers ``429 Too Many Requests`` itself (S3-compatible stores and proxies throttle so);
* ``408``: answers ``408 Request Timeout`` itself (a front end that gave up on a slow request);
* ``500``: answers ``500 InternalError`` itself (S3 asks clients to retry those);
* ``length``: forwards the request, but the response claims more body bytes (``Content-Length``)
  than it carries, then the connection ends: a body-length mismatch;
* ``short``: forwards the request, but cuts 100 bytes off the body *and* its ``Content-Length``:
  a body that looks whole to HTTP (only ``Content-Range`` still tells the real size);
* ``stall``: holds the request for ``stall_s`` (longer than the client timeout), then closes;
* ``truncate``: forwards the request but cuts the response after a few bytes.
* ``flip``: forwards the request and the whole response, with one bit of its body flipped (the
  checksum failure of bytes damaged in transit: the response itself looks fine).

The client under test must retry through all of these and still return the right bytes.
"""

from __future__ import annotations

import contextlib
import os
import random
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator

__all__ = ["FaultProxy", "MotoS3Server", "new_bucket", "s3_env", "shared_server"]

_SERVER_CODE = (
    "import sys\n"
    "from moto.moto_server.threaded_moto_server import ThreadedMotoServer\n"
    "s = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False)\n"
    "s.start()\n"
    "print(s.get_host_and_port()[1], flush=True)\n"
    "sys.stdin.read()\n"
    "s.stop()\n"
)

# Credentials moto accepts; never real ones.
_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@contextlib.contextmanager
def s3_env(endpoint: str) -> Iterator[None]:
    """Points the standard AWS environment variables at ``endpoint`` for the duration."""
    saved = {k: os.environ.get(k) for k in [*_TEST_ENV, "AWS_ENDPOINT_URL", "AWS_PROFILE"]}
    os.environ.update(_TEST_ENV)
    os.environ["AWS_ENDPOINT_URL"] = endpoint
    os.environ.pop("AWS_PROFILE", None)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class MotoS3Server:
    """moto's S3 server in a child process on 127.0.0.1."""

    def __init__(self) -> None:
        env = {**os.environ, **_TEST_ENV}
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER_CODE], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().strip()
        if not line.isdigit():
            self.close()
            raise RuntimeError(f"moto server did not start (printed {line!r})")
        self.port = int(line)
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def make_bucket(self, name: str) -> None:
        """Creates a bucket through the plain HTTP API (no SDK needed)."""
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("PUT", f"/{name}")
            resp = conn.getresponse()
            resp.read()
            if resp.status not in (200, 409):
                raise RuntimeError(f"create bucket {name}: HTTP {resp.status}")
        finally:
            conn.close()

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


class FaultProxy:
    """A TCP proxy on 127.0.0.1 that injects faults into a seeded fraction of HTTP requests."""

    FAULTS = ("reset", "503", "429", "408", "500", "stall", "truncate", "length", "short")  # "flip": when asked
    _ANSWERS = {"503": (b"503 Slow Down", b"SlowDown", b"Please reduce your request rate."),
                "429": (b"429 Too Many Requests", b"TooManyRequests", b"Rate exceeded."),
                "500": (b"500 Internal Server Error", b"InternalError",
                        b"We encountered an internal error. Please try again."),
                "408": (b"408 Request Timeout", b"RequestTimeout",
                        b"Your socket connection to the server was not read from or written to "
                        b"within the timeout period.")}

    def __init__(self, upstream_port: int, *, rate: float, seed: int = 0, stall_s: float = 1.5,
                 faults: tuple[str, ...] = FAULTS, fail_requests: range | None = None) -> None:
        self._upstream = ("127.0.0.1", upstream_port)
        self.rate = rate
        self._fail_requests = fail_requests  # these request numbers (from 0) always get a fault
        self._faults = faults
        self._stall_s = stall_s
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.injected: Counter[str] = Counter()
        self._flipped: set[tuple[bytes, ...]] = set()
        self.requests = 0
        self._stop = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._threads: list[threading.Thread] = []
        self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._accept_thread.start()

    def _roll(self, request: bytes = b"") -> str | None:
        with self._lock:
            n = self.requests
            self.requests += 1
            forced = self._fail_requests is not None and n in self._fail_requests
            if forced and self._faults == ("flip",):
                # A flipped bit is damage in transit: the same range asked again arrives intact,
                # so a reader that refetches always recovers however its requests interleave.
                head = request.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
                what = (head[0], *sorted(v.lower() for v in head[1:]
                                         if v.lower().startswith(b"range:")))
                forced = what not in self._flipped
                self._flipped.add(what)
            if self._rng.random() >= self.rate and not forced:
                return None
            # in turn rather than at random: a run with a few dozen faults meets every kind
            fault = self._faults[sum(self.injected.values()) % len(self._faults)]
            self.injected[fault] += 1
            return fault

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            t = threading.Thread(target=self._serve, args=(client,), daemon=True)
            t.start()
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    @staticmethod
    def _reset(sock: socket.socket) -> None:
        # SO_LINGER 0 makes close() send an RST: the client sees "connection reset by peer".
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self._upstream, timeout=10)
        except OSError:
            self._reset(client)
            return
        new_request = True
        cut_after: int | None = None
        overstate: bytes | None = None  # the "length"/"short" faults: the response seen so far
        understate = False
        flip: bytes | None = None  # the "flip" fault: the response so far, until its body starts
        socks = [client, upstream]
        try:
            while not self._stop.is_set():
                readable, _, _ = select.select(socks, [], [], 0.2)
                for s in readable:
                    data = s.recv(65536)
                    if not data:
                        return
                    if s is client:
                        if new_request:
                            new_request = False
                            fault = self._roll(data)
                            if fault == "reset":
                                self._reset(client)
                                return
                            if fault in self._ANSWERS:
                                status, code, msg = self._ANSWERS[fault]
                                body = (b"<?xml version=\"1.0\"?><Error><Code>" + code +
                                        b"</Code><Message>" + msg + b"</Message></Error>")
                                client.sendall(
                                    b"HTTP/1.1 " + status + b"\r\nContent-Type: application/xml\r\n"
                                    b"Content-Length: " + str(len(body)).encode() +
                                    b"\r\nConnection: close\r\n\r\n" + body)
                                client.close()
                                return
                            if fault == "stall":
                                self._stop.wait(self._stall_s)
                                client.close()
                                return
                            if fault == "truncate":
                                cut_after = self._rng.randrange(50, 4000)
                            if fault in ("length", "short") and data.startswith(b"GET "):
                                overstate = b""  # (a HEAD answer has no body to come short)
                                understate = fault == "short"
                            if fault == "flip":
                                flip = b""
                        upstream.sendall(data)
                    else:
                        new_request = True
                        if overstate is not None:
                            overstate += data
                            head, sep, rest = overstate.partition(b"\r\n\r\n")
                            if not sep:
                                continue  # the header is not complete yet
                            lines = head.split(b"\r\n")
                            size = next((int(v.split(b":", 1)[1]) for v in lines
                                         if v.lower().startswith(b"content-length:")), None)
                            if size is None:  # chunked or empty: nothing to overstate
                                client.sendall(overstate)
                                overstate = None
                                continue
                            lines = [v for v in lines if not v.lower().startswith(
                                (b"content-length:", b"connection:"))]
                            claim = max(0, size - 100) if understate else size + 100
                            lines += [b"Content-Length: " + str(claim).encode(),
                                      b"Connection: close"]
                            while len(rest) < size:  # the whole real body, then stop short
                                more = upstream.recv(65536)
                                if not more:
                                    break
                                rest += more
                            body = rest[:min(size, claim)]
                            client.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + body)
                            client.shutdown(socket.SHUT_WR)  # a clean end, 100 bytes early
                            time.sleep(0.05)
                            return
                        if flip is not None:
                            flip += data
                            head, sep, body = flip.partition(b"\r\n\r\n")
                            if not sep or not body:
                                continue  # no body byte yet
                            k = self._rng.randrange(len(body))
                            body = body[:k] + bytes([body[k] ^ (1 << self._rng.randrange(8))]) \
                                + body[k + 1:]
                            data, flip = head + sep + body, None
                        if cut_after is not None:
                            client.sendall(data[:cut_after])
                            self._reset(client)
                            return
                        client.sendall(data)
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                upstream.close()
            with contextlib.suppress(OSError):
                client.close()

    def close(self) -> None:
        self._stop.set()
        self._accept_thread.join(timeout=5)
        self._listener.close()
        deadline = time.monotonic() + 5
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))


_SHARED: MotoS3Server | None = None


def shared_server() -> MotoS3Server:
    """One moto server for the whole test session (started on first use, stopped at exit)."""
    global _SHARED
    if _SHARED is None:
        import atexit

        _SHARED = MotoS3Server()
        atexit.register(_SHARED.close)
    return _SHARED


_BUCKETS = iter(range(10**9))


def new_bucket(server: MotoS3Server, stem: str = "bkt") -> str:
    """A fresh, empty bucket, so tests never see each other's objects."""
    name = f"{stem}-{os.getpid()}-{next(_BUCKETS)}"
    server.make_bucket(name)
    return name
