"""A controller with the bug an agent must survive: its lists carry revision 5, but its
watch feed answers 410 for every revision (as a restarted controller once did for lists
read without the revision header). Like a controller from before security groups, it
has no such collections (404). Every request's line is appended to LOG.

usage: feed_gone.py LOG; listens on 127.0.0.1:9696, prints "ready" once listening.
"""
import http.server
import json
import sys

log = open(sys.argv[1], "a", buffering=1)
HOST = {"id": "h1", "underlay_ip": "127.0.0.1", "description": "", "tags": [],
        "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
        "revision_number": 1}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Corvid-Revision", "5")
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        log.write(f"GET {self.path}\n")
        path = self.path.split("?")[0]
        if path == "/version":
            self.answer(200, {"version": "0", "cluster_id": "feed-gone"})
            return
        if path == "/v2.0/watch":
            self.answer(410, {"NeutronError": {"type": "WatchRevisionCompacted",
                                               "message": "list again", "detail": ""}})
            return
        plural = path.rstrip("/").rsplit("/", 1)[-1].replace("-", "_")
        if plural.startswith("security_group"):
            self.answer(404, {"NeutronError": {"type": "HTTPNotFound",
                                               "message": "no such collection", "detail": ""}})
            return
        self.answer(200, {plural: [HOST] if plural == "hosts" else []})

    def do_PUT(self):
        log.write(f"PUT {self.path}\n")
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.answer(200, {"host": HOST})

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 9696), Handler)
print("ready", flush=True)
server.serve_forever()
