"""A small OTLP/HTTP trace receiver for plugd's trace tests, on loopback.

Usage: otlp_receiver.py OUT_FILE

Listens on 127.0.0.1 (an ephemeral port), prints `url: http://127.0.0.1:PORT`
once it listens, and answers `POST /v1/traces` (protobuf
`ExportTraceServiceRequest`, decoded with the `opentelemetry-proto`
package) with an empty `ExportTraceServiceResponse`. Every span received is
appended to OUT_FILE as one JSON line: service name, scope, name, kind, hex
trace/span/parent ids, attributes and status. Anything else is a 404.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

OUT = sys.argv[1]


def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def rows(request):
    for rs in request.resource_spans:
        resource = {a.key: value(a.value) for a in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                yield {
                    "service": resource.get("service.name"),
                    "scope": ss.scope.name,
                    "name": s.name,
                    "kind": s.kind,
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex(),
                    "attributes": {a.key: value(a.value) for a in s.attributes},
                    "status": {"code": s.status.code, "message": s.status.message},
                }


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path != "/v1/traces":
            self.send_error(404)
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with open(OUT, "a", encoding="utf-8") as f:
            for row in rows(request):
                f.write(json.dumps(row) + "\n")
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"url: http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
