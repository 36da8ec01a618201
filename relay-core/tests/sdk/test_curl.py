"""Plain curl against the real relay: what a user pasting a README example would do."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from mock_backend import CHAT_MODEL, REPLY, REPLY_PIECES

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")


def curl(*args: str) -> subprocess.CompletedProcess:
    # --noproxy '*': a proxy from the environment must not intercept loopback traffic.
    return subprocess.run(
        ["curl", "--silent", "--show-error", "--noproxy", "*", "--max-time", "20", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def chat_body(stream: bool) -> str:
    body = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body)


def test_curl_chat_completion_non_streaming(relay):
    result = curl(
        "--write-out", "\n%{http_code} %{content_type}",
        "-H", "content-type: application/json",
        "-d", chat_body(stream=False),
        *relay.curl_args(),
        f"{relay.url}/v1/chat/completions",
    )
    assert result.returncode == 0, result.stderr
    body, _, meta = result.stdout.rpartition("\n")
    status, content_type = meta.split(" ", 1)
    assert status == "200"
    assert content_type.startswith("application/json")
    answer = json.loads(body)
    assert answer["choices"][0]["message"]["content"] == REPLY


def test_curl_chat_completion_stream_is_server_sent_events_ending_in_done(relay):
    result = curl(
        "-N", "--include",
        "-H", "content-type: application/json",
        "-d", chat_body(stream=True),
        *relay.curl_args(),
        f"{relay.url}/v1/chat/completions",
    )
    assert result.returncode == 0, result.stderr
    head, _, body = result.stdout.replace("\r\n", "\n").partition("\n\n")
    assert head.startswith("HTTP/1.1 200")
    assert "content-type: text/event-stream" in head.lower()
    events = [block for block in body.split("\n\n") if block.strip()]
    assert all(block.startswith("data: ") for block in events), events
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(block[len("data: "):]) for block in events[:-1]]
    text = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
    assert [t for t in text if t] == REPLY_PIECES
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0


def test_curl_health_reports_status_version_and_the_worker(relay):
    result = curl("--fail", *relay.curl_args(), f"{relay.url}/health")
    assert result.returncode == 0, result.stderr
    health = json.loads(result.stdout)
    assert health["status"] == "ok"
    assert isinstance(health["version"], str) and health["version"]
    assert health["workers_connected"] == 1, "the in-process worker is connected"
    assert health["queue_depth"] == 0
    assert isinstance(health["uptime_secs"], (int, float)) and health["uptime_secs"] >= 0
