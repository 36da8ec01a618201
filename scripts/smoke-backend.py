#!/usr/bin/env python3
"""A tiny OpenAI-compatible model server for scripts/desktop-smoke.sh.

Serves one model, "smoke-model": GET /v1/models, and POST /v1/chat/completions answered
with a streamed reply of CHUNKS words, one every DELAY seconds, so a request stays in flight
long enough to be seen on the dashboard. Standard library only.

Usage: smoke-backend.py PORT [CHUNKS] [DELAY]
"""

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "smoke-model"
CHUNKS = int(sys.argv[2]) if len(sys.argv) > 2 else 16
DELAY = float(sys.argv[3]) if len(sys.argv) > 3 else 0.5


class Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: the end of a streamed body is the end of the connection.
    protocol_version = "HTTP/1.0"

    def log_message(self, *args):
        pass

    def send_json(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        elif self.path in ("/health", "/"):
            self.send_json(200, {"status": "ok"})
        else:
            self.send_json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            request = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            self.send_json(400, {"error": {"message": "invalid JSON"}})
            return
        if self.path != "/v1/chat/completions":
            self.send_json(404, {"error": {"message": f"no route {self.path}"}})
            return
        words = [f"word{i} " for i in range(CHUNKS)]
        if not request.get("stream"):
            self.send_json(200, {
                "id": "smoke", "object": "chat.completion", "model": MODEL,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "".join(words)}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": CHUNKS, "total_tokens": CHUNKS + 1},
            })
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        try:
            for word in words:
                chunk = {"id": "smoke", "object": "chat.completion.chunk", "model": MODEL,
                         "choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
                time.sleep(DELAY)
            end = {"id": "smoke", "object": "chat.completion.chunk", "model": MODEL,
                   "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            self.wfile.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())
        except (BrokenPipeError, ConnectionResetError):
            pass  # the relay cancelled the request


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
