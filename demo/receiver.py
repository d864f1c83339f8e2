"""The demo's downstream: a real HTTP service on 127.0.0.1 that takes flights in bulk.

``POST /flights`` with a JSON array of ``{"id": message id, "flight": {...}}``. A configurable
share of requests is answered 429 or 503 (transient: nothing is accepted). Otherwise each item
gets ``201`` (accepted) or ``422`` when the flight has no departure time (a cancelled flight, a
permanent failure). The receiver remembers accepted ids, so the demo can check that no flight was
accepted twice, and its last answer for every id, so the demo can check each dead letter's error.

``POST /aircraft`` with a JSON array of ``{"id": message id, "tail": tail number, "flight": {...}}``
(the ordered group's): the same share of requests answered 429/503, every other one taken whole;
the receiver keeps each tail number's message ids in the order they arrived (``arrivals``), so
the demo can check that each aircraft's flights arrived in order, each once.
"""

from __future__ import annotations

import json
import random
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CANCELLED_ERROR = "no departure time (cancelled flight)"


class FlightReceiver:
    """Start with ``start()``; ``url`` is the endpoint; ``stop()`` shuts it down."""

    def __init__(self, transient_share: float = 0.05, seed: int = 13):
        if not 0.0 <= transient_share < 1.0:
            raise ValueError(f"transient_share must be in [0, 1), got {transient_share}")
        self.transient_share = transient_share
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self.accepted: set[int] = set()
        self.last_answer: dict[int, str] = {}  # message id -> the error text a consumer reports for it
        self.duplicates = 0
        self.requests = 0
        self.transient = 0
        self.arrivals: dict[str | None, list[int]] = {}  # tail number -> message ids, as they arrived
        self._arrived: set[int] = set()
        self.aircraft_duplicates = 0
        self.aircraft_transient = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                handle = {"/flights": receiver._handle, "/aircraft": receiver._handle_aircraft}.get(self.path)
                if handle is None:
                    return self._reply(404, {"error": "not found"})
                try:
                    items = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                    assert isinstance(items, list)
                except (ValueError, AssertionError):
                    return self._reply(400, {"error": "expected a JSON array"})
                status, body = handle(items)
                self._reply(status, body)

            def _reply(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if status in (429, 503):
                    self.send_header("Retry-After", "10")
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/flights"

    def start(self) -> FlightReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handle(self, items: list) -> tuple[int, dict]:
        with self._lock:
            self.requests += 1
            if self._random.random() < self.transient_share:
                self.transient += 1
                status = 429 if self._random.random() < 0.5 else 503
                for item in items:
                    self.last_answer[item.get("id")] = f"HTTP {status} {HTTPStatus(status).phrase}"
                return status, {"error": HTTPStatus(status).phrase.lower()}
            results = []
            for item in items:
                flight = item.get("flight") or {}
                if flight.get("dep_time") is None:
                    results.append({"id": item.get("id"), "status": 422, "error": CANCELLED_ERROR})
                    self.last_answer[item.get("id")] = f"HTTP 422: {CANCELLED_ERROR}"
                    continue
                if item["id"] in self.accepted:
                    self.duplicates += 1
                self.accepted.add(item["id"])
                self.last_answer[item["id"]] = "accepted"
                results.append({"id": item["id"], "status": 201})
            return 200, {"results": results}

    def _handle_aircraft(self, items: list) -> tuple[int, dict]:
        with self._lock:
            if self._random.random() < self.transient_share:
                self.aircraft_transient += 1
                status = 429 if self._random.random() < 0.5 else 503
                return status, {"error": HTTPStatus(status).phrase.lower()}
            for item in items:
                if item["id"] in self._arrived:
                    self.aircraft_duplicates += 1
                self._arrived.add(item["id"])
                self.arrivals.setdefault(item.get("tail"), []).append(item["id"])
            return 200, {"taken": len(items)}
