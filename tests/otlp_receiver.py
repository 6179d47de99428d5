"""An OTLP/HTTP traces receiver for tests (tests/gateway/test_tracing.py, tests/engines/test_vllm.py): an
http.server in a thread that decodes each export with the message classes opentelemetry-proto ships, so a test
checks the spans a real gateway or a real engine exported."""

from __future__ import annotations

import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


class Receiver:
    """An OTLP/HTTP traces endpoint: keeps every request's raw body and its decoded spans."""

    def __init__(self) -> None:
        self.raw: list[bytes] = []
        self.spans: list[Any] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                with outer.lock:
                    outer.raw.append(body)
                    outer.spans.extend(s for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def trace(self, trace_id: str, n: int, timeout_s: float = 10.0) -> list[Any]:
        """The spans of trace ``trace_id`` (hex) once at least ``n`` arrived; fails after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                got = [s for s in self.spans if s.trace_id.hex() == trace_id]
            if len(got) >= n or time.monotonic() > deadline:
                assert len(got) >= n, f"{len(got)} of {n} spans of trace {trace_id} arrived: {[s.name for s in got]}"
                return got
            time.sleep(0.1)


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def attrs(span: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in span.attributes}
