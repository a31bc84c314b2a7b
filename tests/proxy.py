"""A TCP proxy the caller controls, to partition one process from a server (PostgreSQL, Redis).

``TcpProxy(target_port).start()`` listens on 127.0.0.1 and a free port and forwards every
connection to the target, in threads of the calling process. Then:

- ``cut()``: every open connection is closed at once (the peer sees a reset or end of stream)
  and new connections are closed as soon as they are accepted, until ``heal()``;
- ``blackhole()``: connections stay open and new ones are accepted, but no byte is forwarded
  either way: the peer waits until its own timeouts, as behind a dropped network link; the held
  connections are closed when the proxy heals, as a router would have dropped them;
- ``heal()``: forwarding resumes for new connections.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading

from tests.redis_servers import free_port

FORWARD, CUT, BLACKHOLE = "forward", "cut", "blackhole"


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.mode = FORWARD
        self._pairs: set[tuple[socket.socket, socket.socket | None]] = set()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._closed = threading.Event()

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def start(self) -> TcpProxy:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self._listener = listener
        threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True).start()
        return self

    def cut(self) -> None:
        self.mode = CUT
        self._drop_all()

    def blackhole(self) -> None:
        self.mode = BLACKHOLE

    def heal(self) -> None:
        if self.mode == BLACKHOLE:
            self._drop_all()
        self.mode = FORWARD

    def close(self) -> None:
        self._closed.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
        self._drop_all()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _drop_all(self) -> None:
        with self._lock:
            pairs = list(self._pairs)
            self._pairs.clear()
        for client, upstream in pairs:
            for sock in (client, upstream):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    with contextlib.suppress(OSError):
                        sock.close()

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.mode == CUT:
                with contextlib.suppress(OSError):
                    client.close()
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        if self.mode == FORWARD:
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                with contextlib.suppress(OSError):
                    client.close()
                return
        pair = (client, upstream)
        with self._lock:
            self._pairs.add(pair)
        try:
            self._pump(client, upstream)
        finally:
            with self._lock:
                held = pair in self._pairs
                self._pairs.discard(pair)
            if held:
                for sock in pair:
                    if sock is not None:
                        with contextlib.suppress(OSError):
                            sock.close()

    def cut_after(self, from_client: bool, data: bytes) -> bool:
        """Whether to end this connection once ``data`` has been forwarded (a subclass decides)."""
        return False

    def _pump(self, client: socket.socket, upstream: socket.socket | None) -> None:
        """Forward both ways while the mode is FORWARD; hold (read nothing) while it is BLACKHOLE."""
        while not self._closed.is_set():
            with self._lock:
                if (client, upstream) not in self._pairs:
                    return
            if self.mode != FORWARD or upstream is None:
                # A blackholed connection (or one accepted while blackholed: it never got an
                # upstream) forwards nothing; it ends when the proxy heals or closes.
                self._closed.wait(0.1)
                if upstream is None and self.mode == FORWARD:
                    return
                continue
            try:
                readable, _, _ = select.select([client, upstream], [], [], 0.1)
            except (OSError, ValueError):
                return
            for sock in readable:
                other = upstream if sock is client else client
                try:
                    data = sock.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                try:
                    other.sendall(data)
                except OSError:
                    return
                if self.cut_after(sock is client, data):
                    return
