"""`GET /metrics` of the real relay, read with the Prometheus client library's own parser of the
text exposition format, while real traffic goes through the in-process worker to the mock
backend: the counters must move by exactly what was sent."""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request

import openai
from prometheus_client.parser import text_string_to_metric_families

from conftest import start_relay
from mock_backend import CHAT_MODEL, COMPLETION_TOKENS, PROMPT_TOKENS

MESSAGES = [{"role": "user", "content": "Say hello."}]
#: Bound on the counters catching up with answers the client already read.
SETTLE_TIMEOUT = 5.0
ADMIN_TOKEN = "metrics-test-admin-token"


def request(
    relay, path: str, headers: dict[str, str] | None = None, body: bytes | None = None
) -> tuple[int, str, str]:
    """GET `path` of `relay` (POST of JSON `body` if given), without any proxy, reading the
    whole answer: (status, content type, body)."""
    handlers: list = [urllib.request.ProxyHandler({})]
    if relay.ca_file is not None:
        handlers.append(urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=str(relay.ca_file))))
    opener = urllib.request.build_opener(*handlers)
    headers = dict(headers or {})
    if body is not None:
        headers["Content-Type"] = "application/json"
    message = urllib.request.Request(f"{relay.url}{path}", data=body, headers=headers)
    try:
        with opener.open(message, timeout=20) as response:
            return response.status, response.headers.get("content-type", ""), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("content-type", ""), error.read().decode()


def worker_login(relay, secret: str) -> int:
    """The status a worker's WebSocket handshake with `secret` gets. A plain request to the
    worker endpoint is turned away (426) before any secret is looked at, so this is a real
    handshake (urllib would force `Connection: close`)."""
    url = urllib.parse.urlparse(relay.url)
    if relay.ca_file is not None:
        context = ssl.create_default_context(cafile=str(relay.ca_file))
        connection = http.client.HTTPSConnection(url.hostname, url.port, timeout=20, context=context)
    else:
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=20)
    try:
        connection.request(
            "GET",
            "/v1/worker/connect",
            headers={
                "Connection": "Upgrade",
                "Upgrade": "websocket",
                "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                "X-Worker-Secret": secret,
            },
        )
        return connection.getresponse().status
    finally:
        connection.close()


def scrape(relay, token: str | None = None) -> dict[tuple[str, frozenset], float]:
    """Every sample of `/metrics`, parsed by prometheus_client: {(name, labels): value}."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    status, content_type, text = request(relay, "/metrics", headers)
    assert status == 200, text
    assert content_type.startswith("text/plain; version=0.0.4"), content_type
    samples = {}
    for family in text_string_to_metric_families(text):
        assert family.documentation, f"{family.name} has no HELP"
        assert family.type in ("counter", "gauge", "histogram"), family
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in samples, f"repeated sample {key}"
            samples[key] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def moved(before: dict, after: dict, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def test_counters_move_with_real_traffic_through_a_worker(relay):
    before = scrape(relay)
    whole, streams = 3, 2
    with openai.OpenAI(
        base_url=f"{relay.url}/v1", api_key="x", max_retries=0, timeout=20, http_client=relay.http_client(openai)
    ) as client:
        for _ in range(whole):
            client.chat.completions.create(model=CHAT_MODEL, messages=MESSAGES)
        # The SDK hangs up at `data: [DONE]`, usually before the worker's final report (with
        # the backend's usage) reaches the relay, which waits a moment for it.
        for _ in range(streams):
            chunks = list(
                client.chat.completions.create(
                    model=CHAT_MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
                )
            )
            assert chunks[-1].usage.completion_tokens == COMPLETION_TOKENS
    # And a stream read to the end of its body, as curl reads it.
    body = {"model": CHAT_MODEL, "messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}}
    status, _, text = request(relay, "/v1/chat/completions", body=json.dumps(body).encode())
    assert status == 200, text
    assert text.rstrip().endswith("data: [DONE]"), text
    streams += 1
    # A worker presenting a wrong secret.
    assert worker_login(relay, "not-the-secret") == 401

    ok = {"model": CHAT_MODEL, "key": "anonymous", "status": "200"}
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        # A stream counts when the relay's side of it ends, a moment after the client read it.
        after = scrape(relay)
        if moved(before, after, "modelrelay_requests_total", **ok) >= whole + streams or time.monotonic() > deadline:
            break
        time.sleep(0.05)

    total = whole + streams
    assert moved(before, after, "modelrelay_requests_total", **ok) == total
    per_key = {"model": CHAT_MODEL, "key": "anonymous"}
    assert moved(before, after, "modelrelay_output_tokens_total", **per_key) == total * COMPLETION_TOKENS
    assert moved(before, after, "modelrelay_input_tokens_total", **per_key) == total * PROMPT_TOKENS
    model = {"model": CHAT_MODEL}
    assert moved(before, after, "modelrelay_time_to_first_token_seconds_count", **model) == streams
    assert moved(before, after, "modelrelay_request_duration_seconds_count", **model) == total
    assert moved(before, after, "modelrelay_request_duration_seconds_bucket", le="+Inf", **model) == total
    assert moved(before, after, "modelrelay_request_duration_seconds_sum", **model) > 0
    assert moved(before, after, "modelrelay_auth_failures_total", kind="worker") == 1
    assert moved(before, after, "modelrelay_cancels_total", reason="client_disconnect") == 0, (
        "a client hanging up at [DONE] has the whole answer: nothing to cancel"
    )
    assert value(after, "modelrelay_workers_connected", provider="local") == 1
    assert value(after, "modelrelay_requests_in_flight") == 0
    assert value(after, "modelrelay_queue_depth", provider="local") == 0
    capacities = [v for (name, _), v in after.items() if name == "modelrelay_worker_capacity"]
    assert capacities and capacities[0] > 0, "the in-process worker's capacity is shown"


def test_a_configured_admin_token_guards_metrics_unless_they_are_made_public(backend, tmp_path):
    guarded_dir = tmp_path / "guarded"
    guarded_dir.mkdir()
    guarded = start_relay(backend, guarded_dir, extra_env={"MODELRELAY_ADMIN_TOKEN": ADMIN_TOKEN})
    try:
        status, _, body = request(guarded, "/metrics")
        assert status == 401, body
        assert "--metrics-public" in body, body
        status, _, body = request(guarded, "/metrics", {"Authorization": "Bearer wrong"})
        assert status == 401, body
        samples = scrape(guarded, token=ADMIN_TOKEN)
        assert value(samples, "modelrelay_auth_failures_total", kind="admin") == 2
    finally:
        guarded.kill()

    public_dir = tmp_path / "public"
    public_dir.mkdir()
    public = start_relay(
        backend,
        public_dir,
        extra_env={"MODELRELAY_ADMIN_TOKEN": ADMIN_TOKEN, "MODELRELAY_METRICS_PUBLIC": "true"},
    )
    try:
        samples = scrape(public)
        assert value(samples, "modelrelay_workers_connected", provider="local") == 1
        status, _, _ = request(public, "/api/status")
        assert status == 401, "the control API keeps its token"
    finally:
        public.kill()
