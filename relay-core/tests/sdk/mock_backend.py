"""A small model server that speaks the OpenAI and Anthropic HTTP APIs natively.

Standard library only. It answers with fixed, deterministic text so tests can check exactly what
travelled through the relay, and it records every request (method, path, headers, JSON body) so
tests can see what the relay forwarded: `GET /_seen` returns that list, `DELETE /_seen` clears it.

Streams use HTTP/1.1 chunked transfer encoding with a flush after every event, so each event leaves
the process on its own. A request body may carry `"mock_chunk_delay": SECONDS` to slow a stream
down (the relay passes bodies through untouched, so this reaches the backend). A `/v1/responses`
body with `"mock_llama_events": true` is streamed as llama-server streams it: its events carry no
`sequence_number`, `output_index` or `content_index`.

With `chat_only=True` it plays a backend that speaks only OpenAI chat completions (Ollama before
0.14, llamafile, ...): `/v1/messages`, `/v1/messages/count_tokens` and `/v1/responses` answer
`404 page not found`, so the relay must translate. In either mode a chat request with `tools`
whose last message is not a tool result is answered with a call of the first tool, each of its
schema's properties filled with `"mock <name>"`.

Run it alone with `python3 mock_backend.py [--chat-only]` to poke at it with curl.
"""

from __future__ import annotations

import base64
import json
import struct
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable

#: The chat/completions/responses/messages model the backend lists.
CHAT_MODEL = "mock-model"
#: The embedding model the backend lists.
EMBED_MODEL = "mock-embed"
#: What every generation answers, and how streams split it.
REPLY_PIECES = ["Hello", " from", " the", " mock", " backend", "."]
REPLY = "".join(REPLY_PIECES)
#: The length of every embedding vector.
EMBED_DIM = 4
#: Routes a chat-only backend does not have.
NATIVE_ONLY_ROUTES = ("/v1/messages", "/v1/messages/count_tokens", "/v1/responses")
#: The id of the tool call the mock makes.
TOOL_CALL_ID = "call_mock_1"
#: Fixed token counts reported in every usage object.
PROMPT_TOKENS = 7
COMPLETION_TOKENS = len(REPLY_PIECES)


def _now() -> int:
    return int(time.time())


def _short_id() -> str:
    return uuid.uuid4().hex[:24]


def tool_call_for(tools: list) -> tuple[str, str]:
    """The mock's call of the first tool: (name, JSON arguments filling each property)."""
    function = tools[0].get("function", {}) if isinstance(tools[0], dict) else {}
    properties = (function.get("parameters") or {}).get("properties") or {}
    return function.get("name", "tool"), json.dumps({name: f"mock {name}" for name in properties})


def embedding_for(index: int) -> list[float]:
    """A deterministic vector per input position (exactly representable in float32)."""
    return [float(index) + k / 4 for k in range(EMBED_DIM)]


def _response_object(resp_id: str, msg_id: str, model: str, status: str, text: str | None) -> dict:
    """An OpenAI Responses `response` object; `text=None` means no output yet."""
    output = []
    if text is not None:
        output.append(
            {
                "type": "message",
                "id": msg_id,
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
            }
        )
    completed = status == "completed"
    return {
        "id": resp_id,
        "object": "response",
        "created_at": _now(),
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "temperature": 1.0,
        "top_p": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": {},
        "usage": {
            "input_tokens": PROMPT_TOKENS,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": COMPLETION_TOKENS,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        }
        if completed
        else None,
    }


def _anthropic_message(msg_id: str, model: str, text: str | None) -> dict:
    """An Anthropic Messages `message`; `text=None` is the empty start-of-stream message."""
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [] if text is None else [{"type": "text", "text": text}],
        "stop_reason": None if text is None else "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": PROMPT_TOKENS,
            "output_tokens": 1 if text is None else COMPLETION_TOKENS,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "MockBackend._Server"
    #: The current request's parsed JSON body.
    _body: Any = None

    # -- plumbing ---------------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # keep pytest output clean

    def _read_json(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def _record(self, body: Any) -> None:
        with self.server.lock:
            self.server.seen.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": body,
                }
            )

    def _send_json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _send_text(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _openai_error(self, status: int, message: str) -> None:
        self._send_json(status, {"error": {"message": message, "type": "invalid_request_error", "code": None}})

    def _anthropic_error(self, status: int, message: str) -> None:
        self._send_json(status, {"type": "error", "error": {"type": "invalid_request_error", "message": message}})

    def _stream(self, events: Iterable[str]) -> None:
        """Sends each already-formatted SSE event as its own chunk, flushed at once, pausing
        between events (the request's `mock_chunk_delay` field, or the server's default)."""
        delay = self.server.chunk_delay
        if isinstance(self._body, dict) and isinstance(self._body.get("mock_chunk_delay"), (int, float)):
            delay = float(self._body["mock_chunk_delay"])
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        for event in events:
            data = event.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
            if delay:
                time.sleep(delay)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    @staticmethod
    def _data(payload: Any) -> str:
        return f"data: {json.dumps(payload)}\n\n"

    @staticmethod
    def _named(name: str, payload: Any) -> str:
        return f"event: {name}\ndata: {json.dumps(payload)}\n\n"

    # -- routes -----------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._body = None
        path = self.path.split("?", 1)[0]
        if path == "/_seen":
            with self.server.lock:
                self._send_json(200, list(self.server.seen))
            return
        self._record(None)
        if path == "/v1/models":
            self._send_json(
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": CHAT_MODEL, "object": "model", "created": 0, "owned_by": "mock"},
                        {"id": EMBED_MODEL, "object": "model", "created": 0, "owned_by": "mock"},
                    ],
                },
            )
            return
        self._openai_error(404, f"mock backend: no route for GET {path}")

    def do_DELETE(self) -> None:  # noqa: N802 - stdlib naming
        if self.path.split("?", 1)[0] == "/_seen":
            with self.server.lock:
                self.server.seen.clear()
            self._send_json(200, {"cleared": True})
            return
        self._openai_error(404, "mock backend: no such route")

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        path = self.path.split("?", 1)[0]
        body = self._read_json()
        self._body = body
        self._record(body)
        routes = {
            "/v1/chat/completions": self._chat,
            "/v1/completions": self._completions,
            "/v1/embeddings": self._embeddings,
            "/v1/responses": self._responses,
            "/v1/messages": self._messages,
            "/v1/messages/count_tokens": self._count_tokens,
        }
        handler = routes.get(path)
        if self.server.chat_only and path in NATIVE_ONLY_ROUTES:
            handler = None
        if handler is None:
            if self.server.chat_only:
                self._send_text(404, "404 page not found")
                return
            self._openai_error(404, f"mock backend: no route for POST {path}")
            return
        if not isinstance(body, dict):
            (self._anthropic_error if path.startswith("/v1/messages") else self._openai_error)(
                400, "mock backend: body must be a JSON object"
            )
            return
        handler(body)

    # OpenAI Chat Completions
    def _chat(self, body: dict) -> None:
        model = body.get("model", CHAT_MODEL)
        chat_id = f"chatcmpl-{_short_id()}"
        created = _now()
        usage = {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": COMPLETION_TOKENS,
            "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        }
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        last_role = messages[-1].get("role") if messages and isinstance(messages[-1], dict) else None
        tools = body.get("tools") if isinstance(body.get("tools"), list) else []
        if tools and last_role != "tool":
            self._chat_tool_call(body, chat_id, created, usage, tool_call_for(tools))
            return
        if not body.get("stream"):
            self._send_json(
                200,
                {
                    "id": chat_id,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": REPLY, "refusal": None},
                            "logprobs": None,
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": usage,
                    "system_fingerprint": "mock",
                },
            )
            return
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict, finish: str | None) -> dict:
            return {
                "id": chat_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": "mock",
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }

        def events() -> Iterable[str]:
            yield self._data(chunk({"role": "assistant", "content": ""}, None))
            for piece in REPLY_PIECES:
                yield self._data(chunk({"content": piece}, None))
            yield self._data(chunk({}, "stop"))
            if include_usage:
                final = chunk({}, None)
                final["choices"] = []
                final["usage"] = usage
                yield self._data(final)
            yield "data: [DONE]\n\n"

        self._stream(events())

    def _chat_tool_call(self, body: dict, chat_id: str, created: int, usage: dict, call: tuple[str, str]) -> None:
        """Answers with a call of the first tool (streamed as id and name, then the arguments in
        two fragments)."""
        model = body.get("model", CHAT_MODEL)
        name, arguments = call
        if not body.get("stream"):
            tool_call = {"id": TOOL_CALL_ID, "type": "function", "function": {"name": name, "arguments": arguments}}
            self._send_json(
                200,
                {
                    "id": chat_id,
                    "object": "chat.completion",
                    "created": created,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": None, "tool_calls": [tool_call]},
                            "finish_reason": "tool_calls",
                        }
                    ],
                    "usage": usage,
                },
            )
            return

        def chunk(delta: dict, finish: str | None) -> dict:
            return {
                "id": chat_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }

        def events() -> Iterable[str]:
            yield self._data(chunk({"role": "assistant", "content": None}, None))
            first = {"index": 0, "id": TOOL_CALL_ID, "type": "function", "function": {"name": name, "arguments": ""}}
            yield self._data(chunk({"tool_calls": [first]}, None))
            half = len(arguments) // 2
            for fragment in (arguments[:half], arguments[half:]):
                yield self._data(chunk({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]}, None))
            yield self._data(chunk({}, "tool_calls"))
            if (body.get("stream_options") or {}).get("include_usage"):
                final = chunk({}, None)
                final["choices"] = []
                final["usage"] = usage
                yield self._data(final)
            yield "data: [DONE]\n\n"

        self._stream(events())

    # OpenAI (legacy) Completions
    def _completions(self, body: dict) -> None:
        model = body.get("model", CHAT_MODEL)
        cmpl_id = f"cmpl-{_short_id()}"
        created = _now()
        if not body.get("stream"):
            self._send_json(
                200,
                {
                    "id": cmpl_id,
                    "object": "text_completion",
                    "created": created,
                    "model": model,
                    "choices": [{"index": 0, "text": REPLY, "logprobs": None, "finish_reason": "stop"}],
                    "usage": {
                        "prompt_tokens": PROMPT_TOKENS,
                        "completion_tokens": COMPLETION_TOKENS,
                        "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
                    },
                },
            )
            return

        def events() -> Iterable[str]:
            for i, piece in enumerate(REPLY_PIECES):
                last = i == len(REPLY_PIECES) - 1
                yield self._data(
                    {
                        "id": cmpl_id,
                        "object": "text_completion",
                        "created": created,
                        "model": model,
                        "choices": [
                            {"index": 0, "text": piece, "logprobs": None, "finish_reason": "stop" if last else None}
                        ],
                    }
                )
            yield "data: [DONE]\n\n"

        self._stream(events())

    # OpenAI Embeddings
    def _embeddings(self, body: dict) -> None:
        inputs = body.get("input")
        if isinstance(inputs, (str, int)) or (isinstance(inputs, list) and inputs and isinstance(inputs[0], int)):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs:
            self._openai_error(400, "mock backend: `input` must be a string or a non-empty list")
            return
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for i in range(len(inputs)):
            vector = embedding_for(i)
            encoded: Any = vector
            if as_base64:
                encoded = base64.b64encode(struct.pack(f"<{EMBED_DIM}f", *vector)).decode()
            data.append({"object": "embedding", "index": i, "embedding": encoded})
        self._send_json(
            200,
            {
                "object": "list",
                "data": data,
                "model": body.get("model", EMBED_MODEL),
                "usage": {"prompt_tokens": PROMPT_TOKENS, "total_tokens": PROMPT_TOKENS},
            },
        )

    # OpenAI Responses
    def _responses(self, body: dict) -> None:
        model = body.get("model", CHAT_MODEL)
        resp_id = f"resp_{_short_id()}"
        msg_id = f"msg_{_short_id()}"
        if not body.get("stream"):
            self._send_json(200, _response_object(resp_id, msg_id, model, "completed", REPLY))
            return

        # llama-server numbers nothing: the relay must fill in what the OpenAI SDK relies on.
        omitted = {"sequence_number", "output_index", "content_index"} if body.get("mock_llama_events") else set()

        def events() -> Iterable[str]:
            seq = iter(range(1_000_000))

            def ev(name: str, **fields: Any) -> str:
                event = {"type": name, "sequence_number": next(seq), **fields}
                return self._named(name, {key: value for key, value in event.items() if key not in omitted})

            common = {"item_id": msg_id, "output_index": 0, "content_index": 0}
            yield ev("response.created", response=_response_object(resp_id, msg_id, model, "in_progress", None))
            yield ev("response.in_progress", response=_response_object(resp_id, msg_id, model, "in_progress", None))
            yield ev(
                "response.output_item.added",
                output_index=0,
                item={"type": "message", "id": msg_id, "role": "assistant", "status": "in_progress", "content": []},
            )
            yield ev(
                "response.content_part.added",
                **common,
                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
            )
            for piece in REPLY_PIECES:
                yield ev("response.output_text.delta", **common, delta=piece, logprobs=[])
            yield ev("response.output_text.done", **common, text=REPLY, logprobs=[])
            yield ev(
                "response.content_part.done",
                **common,
                part={"type": "output_text", "text": REPLY, "annotations": [], "logprobs": []},
            )
            final = _response_object(resp_id, msg_id, model, "completed", REPLY)
            yield ev("response.output_item.done", output_index=0, item=final["output"][0])
            yield ev("response.completed", response=final)

        self._stream(events())

    # Anthropic Messages
    def _messages(self, body: dict) -> None:
        model = body.get("model", CHAT_MODEL)
        if not isinstance(body.get("messages"), list) or not body.get("max_tokens"):
            self._anthropic_error(400, "mock backend: `messages` and `max_tokens` are required")
            return
        msg_id = f"msg_{_short_id()}"
        if not body.get("stream"):
            self._send_json(200, _anthropic_message(msg_id, model, REPLY))
            return

        def events() -> Iterable[str]:
            yield self._named("message_start", {"type": "message_start", "message": _anthropic_message(msg_id, model, None)})
            yield self._named(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            )
            yield self._named("ping", {"type": "ping"})
            for piece in REPLY_PIECES:
                yield self._named(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}},
                )
            yield self._named("content_block_stop", {"type": "content_block_stop", "index": 0})
            yield self._named(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": COMPLETION_TOKENS},
                },
            )
            yield self._named("message_stop", {"type": "message_stop"})

        self._stream(events())

    # Anthropic token counting
    def _count_tokens(self, body: dict) -> None:
        messages = body.get("messages")
        if not isinstance(messages, list):
            self._anthropic_error(400, "mock backend: `messages` is required")
            return
        # One token per whitespace-separated word of string contents: deterministic and checkable.
        words = 0
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                words += len(content.split())
        self._send_json(200, {"input_tokens": words})


class MockBackend:
    """The server, running on a background thread on 127.0.0.1 and an ephemeral port."""

    class _Server(ThreadingHTTPServer):
        daemon_threads = True
        seen: list
        lock: threading.Lock
        chunk_delay: float
        chat_only: bool

    def __init__(self, chunk_delay: float = 0.0, chat_only: bool = False) -> None:
        self._server = self._Server(("127.0.0.1", 0), _Handler)
        self._server.seen = []
        self._server.lock = threading.Lock()
        self._server.chunk_delay = chunk_delay
        self._server.chat_only = chat_only
        self._thread = threading.Thread(target=self._server.serve_forever, name="mock-backend", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def seen(self) -> list[dict]:
        """Every request so far (the same list `GET /_seen` returns)."""
        with self._server.lock:
            return list(self._server.seen)

    def start(self) -> "MockBackend":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


if __name__ == "__main__":
    import sys

    backend = MockBackend(chat_only="--chat-only" in sys.argv[1:]).start()
    print(f"mock backend at {backend.url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        backend.stop()
