"""A TCP proxy in front of PostgreSQL that loses a commit's answer: once armed with a trigger, it
forwards the first client message that contains the trigger, lets the server answer it in full
(up to a ReadyForQuery outside any transaction, or a COMMIT's CommandComplete in a pipeline, whose
ReadyForQuery waits for the client's Sync: the transaction is committed; a ReadyForQuery inside a
transaction passes, with what came before it), and then closes both sides without passing the
answer on. The client sees its connection drop with its commit done. A trigger whose transaction
failed or rolled back has no commit to lose: its answers pass, and the proxy is disarmed unfired.

It parses the PostgreSQL protocol's framing only: untyped start-up messages (SSLRequest,
GSSENCRequest, StartupMessage), then typed messages (one type byte and a length)."""

from __future__ import annotations

import socket
import struct
import threading

SSL_REQUEST, GSSENC_REQUEST = 80877103, 80877104


class LostAnswerProxy:
    """``start()``, then point clients at ``port``; ``arm(b"COMMIT")`` loses the next answer to a
    message containing ``COMMIT``; ``arm(b"redelivery:ACK", b"COMMIT")`` the answer to the first
    ``COMMIT`` after a message containing ``redelivery:ACK`` (the commit of a transaction with an ack in it);
    ``fired`` is set once it did."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1"):
        self.target = (target_host, target_port)
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.trigger: list[bytes] = []  # the messages to see, in order: the last one's answer is lost
        self.fired = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> LostAnswerProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def arm(self, *triggers: bytes) -> None:
        with self._lock:
            self.trigger, self.fired = list(triggers), threading.Event()

    def close(self) -> None:
        self.server.close()

    def _take_trigger(self, message: bytes) -> bool:
        """Whether ``message`` is the last awaited one (its answer is then lost)."""
        with self._lock:
            if self.trigger and self.trigger[0] in message:
                self.trigger.pop(0)
                return not self.trigger
        return False

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            dropping = threading.Event()
            threading.Thread(
                target=self._client_to_server, args=(client, upstream, dropping), daemon=True
            ).start()
            threading.Thread(
                target=self._server_to_client, args=(upstream, client, dropping), daemon=True
            ).start()

    def _client_to_server(self, client: socket.socket, upstream: socket.socket, dropping: threading.Event):
        try:
            started = False
            while True:
                if not started:
                    header = _read(client, 4)
                    body = _read(client, struct.unpack("!i", header)[0] - 4)
                    code = struct.unpack("!i", body[:4])[0]
                    started = code not in (SSL_REQUEST, GSSENC_REQUEST)
                    upstream.sendall(header + body)
                    continue
                header = _read(client, 5)
                body = _read(client, struct.unpack("!i", header[1:])[0] - 4)
                if self._take_trigger(header + body):
                    dropping.set()  # from now on the server's answers stop here
                upstream.sendall(header + body)
        except OSError:
            _close(client, upstream)

    def _server_to_client(self, upstream: socket.socket, client: socket.socket, dropping: threading.Event):
        held: list[bytes] = []  # the answers after the trigger, until a ReadyForQuery says which
        failed = False  # an error or a rollback since the trigger: what follows commits nothing
        try:
            started = False
            while True:
                if not started:  # answers to SSLRequest / GSSENCRequest are one byte
                    first = _read(upstream, 1)
                    if first in (b"N", b"S", b"G"):
                        client.sendall(first)
                        continue
                    started = True
                    header = first + _read(upstream, 4)
                else:
                    header = _read(upstream, 5)
                body = _read(upstream, struct.unpack("!i", header[1:])[0] - 4)
                if dropping.is_set():
                    held.append(header + body)
                    kind = header[:1]
                    failed = failed or kind == b"E" or (kind == b"C" and body.startswith(b"ROLLBACK\x00"))
                    if kind in (b"G", b"W"):  # a COPY waits for the client's data: answered now
                        client.sendall(b"".join(held))
                        held.clear()
                    elif kind == b"Z" and (body[:1] != b"I" or failed):  # inside a transaction, or
                        client.sendall(b"".join(held))  # nothing committed: answered as it is
                        held.clear()
                        if failed:  # no commit to lose: disarmed, not fired
                            dropping.clear()
                            failed = False
                    # the server is done with it, outside any transaction (or, in a pipeline, whose
                    # ReadyForQuery waits for its Sync, the COMMIT's CommandComplete came): the
                    # commit happened
                    elif kind == b"Z" or (kind == b"C" and body.startswith(b"COMMIT\x00")):
                        self.fired.set()
                        _close(client, upstream)
                        return
                    continue
                client.sendall(header + body)
        except OSError:
            _close(client, upstream)


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise OSError("connection closed")
        data += chunk
    return data


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
