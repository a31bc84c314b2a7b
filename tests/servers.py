"""Real local servers for the alert tests: an HTTP endpoint (Slack, Telegram, webhooks,
Sentry's ingestion) and an SMTP server, each on 127.0.0.1 and a free port, recording what
they receive."""

from __future__ import annotations

import dataclasses
import email
import email.message
import email.policy
import gzip
import json
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiosmtpd.controller import Controller

from tests.redis_servers import free_port


@dataclasses.dataclass(frozen=True, kw_only=True)
class Request:
    """One request as the server read it."""

    method: str
    path: str
    headers: dict[str, str]  # names lower-cased
    raw: bytes  # the body's bytes exactly as they came over the wire
    body: bytes  # the same, decompressed when the request said Content-Encoding
    at: float  # time.monotonic() when it arrived

    def json(self) -> Any:
        return json.loads(self.body)


def _decompress(raw: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.decompress(raw)
    if encoding == "deflate":
        return zlib.decompress(raw)
    if encoding == "br":
        import brotli  # type: ignore[import-not-found]  # only if the SDK compressed with it

        return bytes(brotli.decompress(raw))
    return raw


class HttpServer:
    """``ThreadingHTTPServer`` that records every request. It answers 200 ``{"ok": true}``
    unless told otherwise: ``answer(500, times=3)`` queues answers used first, in order
    (a body may name the request's ``{path}``, as some servers echo it); ``hang`` seconds
    (or until ``stop``) makes it hold every request before answering."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.hang = 0.0
        self._answers: list[tuple[int, str]] = []
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._server.block_on_close = False
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="test-http-server", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def answer(self, status: int, body: str = "", *, times: int = 1) -> None:
        with self._lock:
            self._answers += [(status, body)] * times

    def received(self, path_prefix: str = "") -> list[Request]:
        with self._lock:
            return [request for request in self.requests if request.path.startswith(path_prefix)]

    def start(self) -> HttpServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._release.set()  # let hanging handlers go
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _next_answer(self) -> tuple[int, str]:
        with self._lock:
            return self._answers.pop(0) if self._answers else (200, '{"ok": true}')

    def _record(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                headers = {name.lower(): value for name, value in self.headers.items()}
                owner._record(Request(method=self.command, path=self.path, headers=headers, raw=raw,
                                      body=_decompress(raw, headers.get("content-encoding", "")),
                                      at=time.monotonic()))
                if owner.hang:
                    owner._release.wait(owner.hang)
                status, text = owner._next_answer()
                payload = text.replace("{path}", self.path).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json" if text.startswith("{") else "text/plain")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:  # the client gave up (a timeout test)
                    pass

            do_POST = do_GET = do_PUT = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler


def envelope_items(request: Request) -> list[tuple[dict[str, Any], Any]]:
    """Sentry's envelope format: a JSON header line, then per item a JSON item header line
    and its payload (``length`` bytes when the header says so, else up to the newline).
    Returns (item header, payload parsed as JSON when it is JSON)."""
    _header, _, rest = request.body.partition(b"\n")
    items: list[tuple[dict[str, Any], Any]] = []
    while rest.strip():
        line, _, rest = rest.partition(b"\n")
        if not line.strip():
            continue
        item_header = json.loads(line)
        length = item_header.get("length")
        if length is None:
            payload, _, rest = rest.partition(b"\n")
        else:
            payload, rest = rest[:length], rest[length:]
            rest = rest.removeprefix(b"\n")
        try:
            parsed: Any = json.loads(payload)
        except ValueError:
            parsed = payload
        items.append((item_header, parsed))
    return items


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mail:
    mail_from: str
    rcpt_tos: list[str]
    content: bytes

    def message(self) -> email.message.EmailMessage:
        parsed = email.message_from_bytes(self.content, policy=email.policy.default)
        assert isinstance(parsed, email.message.EmailMessage)
        return parsed


class SmtpServer:
    """aiosmtpd's ``Controller`` on 127.0.0.1: every message it accepts lands in ``mails``."""

    def __init__(self) -> None:
        self.mails: list[Mail] = []
        self.port = free_port()
        self._controller = Controller(self, hostname="127.0.0.1", port=self.port)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        content = envelope.original_content or envelope.content or b""
        self.mails.append(Mail(mail_from=str(envelope.mail_from), rcpt_tos=list(envelope.rcpt_tos),
                               content=content if isinstance(content, bytes) else content.encode()))
        return "250 Message accepted for delivery"

    def start(self) -> SmtpServer:
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()

