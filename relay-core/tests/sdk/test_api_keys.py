"""Client API keys through the official SDKs and curl, against the real `modelrelay` with
`MODELRELAY_REQUIRE_API_KEYS` and `MODELRELAY_ADMIN_TOKEN` set: what a user who turned keys on
and handed one to each app would see. Keys are made and revoked through the published `/admin`
API, usage is read back from `/admin/usage`."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import anthropic
import openai
import pytest

from conftest import ADMIN_TOKEN, admin_call, assert_clean_exit, create_key, start_keyed_relay
from mock_backend import CHAT_MODEL, COMPLETION_TOKENS, EMBED_DIM, EMBED_MODEL, PROMPT_TOKENS, REPLY, REPLY_PIECES

MESSAGES = [{"role": "user", "content": "Say hello."}]
#: A well-formed key the relay never issued.
UNKNOWN_KEY = "mr-" + "0" * 40
#: Bound on usage reaching the database (the writer stores a batch every 0.5 s).
USAGE_TIMEOUT = 10.0


def openai_client(relay, key: str) -> openai.OpenAI:
    # No retries: a refusal must surface as the relay's own answer, not be retried away.
    return openai.OpenAI(
        base_url=f"{relay.url}/v1", api_key=key, max_retries=0, timeout=20, http_client=relay.http_client(openai)
    )


def anthropic_client(relay, **credentials) -> anthropic.Anthropic:
    """`credentials`: `api_key=` (sent as `x-api-key`, as Claude Code's `ANTHROPIC_API_KEY`) or
    `auth_token=` (sent as `Authorization: Bearer`, as `ANTHROPIC_AUTH_TOKEN`)."""
    return anthropic.Anthropic(
        base_url=relay.url, max_retries=0, timeout=20, http_client=relay.http_client(anthropic), **credentials
    )


def chat(client: openai.OpenAI) -> str:
    return client.chat.completions.create(model=CHAT_MODEL, messages=MESSAGES).choices[0].message.content


def usage_row(relay, key_id: str, query: str = "group_by=key") -> dict | None:
    status, report, _ = admin_call(relay, "GET", f"/admin/usage?{query}")
    assert status == 200, report
    return next((row for row in report["rows"] if row["group"] == key_id), None)


def wait_for_usage(relay, key_id: str, requests: int) -> dict:
    """The key's row of `/admin/usage?group_by=key` once it counts `requests` (usage is written
    in batches, so it lags the answers by up to a batch interval)."""
    deadline = time.monotonic() + USAGE_TIMEOUT
    row = None
    while time.monotonic() < deadline:
        row = usage_row(relay, key_id)
        if row is not None and row["requests"] >= requests:
            return row
        time.sleep(0.2)
    pytest.fail(f"usage of {key_id} did not reach {requests} requests within {USAGE_TIMEOUT}s: {row}")


def test_openai_sdk_with_a_key_chats_and_streams_and_the_key_stays_at_the_relay(keyed_relay, seen):
    key = create_key(keyed_relay)["key"]
    with openai_client(keyed_relay, key) as client:
        assert chat(client) == REPLY
        stream = client.chat.completions.create(
            model=CHAT_MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert deltas == REPLY_PIECES
        assert chunks[-1].usage.completion_tokens == COMPLETION_TOKENS
        embedding = client.embeddings.create(model=EMBED_MODEL, input="hi")
        assert len(embedding.data[0].embedding) == EMBED_DIM
        assert CHAT_MODEL in {m.id for m in client.models.list()}, "/v1/models opens with the key"
    forwarded = [r for r in seen() if r["path"].startswith("/v1/")]
    assert len(forwarded) == 3
    assert all("authorization" not in r["headers"] for r in forwarded), "the relay's key never reaches a backend"


def test_anthropic_sdk_with_a_key_in_x_api_key_or_bearer_creates_and_streams(keyed_relay, seen):
    key = create_key(keyed_relay)["key"]
    for credentials in ({"api_key": key}, {"auth_token": key}):
        with anthropic_client(keyed_relay, **credentials) as client:
            message = client.messages.create(model=CHAT_MODEL, max_tokens=64, messages=MESSAGES)
            assert message.content[0].text == REPLY, credentials
            assert message.usage.input_tokens == PROMPT_TOKENS
            with client.messages.stream(model=CHAT_MODEL, max_tokens=64, messages=MESSAGES) as stream:
                pieces = list(stream.text_stream)
                final = stream.get_final_message()
            assert pieces == REPLY_PIECES, credentials
            assert final.stop_reason == "end_turn"
    forwarded = [r for r in seen() if r["path"] == "/v1/messages"]
    assert len(forwarded) == 4
    assert all("x-api-key" not in r["headers"] and "authorization" not in r["headers"] for r in forwarded)


def test_a_key_the_relay_never_issued_is_an_authentication_error_in_both_sdks(keyed_relay):
    with openai_client(keyed_relay, UNKNOWN_KEY) as client:
        with pytest.raises(openai.AuthenticationError) as refused:
            chat(client)
        assert refused.value.status_code == 401
        assert refused.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            client.models.list()
    with openai_client(keyed_relay, "sk-an-openai-key") as client:
        with pytest.raises(openai.AuthenticationError, match="not valid"):
            chat(client)
    for credentials in ({"api_key": UNKNOWN_KEY}, {"auth_token": UNKNOWN_KEY}):
        with anthropic_client(keyed_relay, **credentials) as client:
            with pytest.raises(anthropic.AuthenticationError) as refused:
                client.messages.create(model=CHAT_MODEL, max_tokens=8, messages=MESSAGES)
            assert refused.value.status_code == 401
            body = refused.value.body
            assert (body["type"], body["error"]["type"]) == ("error", "authentication_error"), "Anthropic's shape"


def test_a_revoked_key_makes_the_same_clients_fail_with_authentication_error(keyed_relay):
    made = create_key(keyed_relay)
    key = made["key"]
    with openai_client(keyed_relay, key) as oai, anthropic_client(keyed_relay, api_key=key) as claude:
        assert chat(oai) == REPLY
        assert claude.messages.create(model=CHAT_MODEL, max_tokens=8, messages=MESSAGES).content[0].text == REPLY
        status, revoked, _ = admin_call(keyed_relay, "DELETE", f"/admin/keys/{made['id']}")
        assert (status, revoked) == (200, {"id": made["id"], "revoked": True})
        with pytest.raises(openai.AuthenticationError) as refused:
            chat(oai)
        assert refused.value.code == "invalid_api_key"
        with pytest.raises(anthropic.AuthenticationError):
            claude.messages.create(model=CHAT_MODEL, max_tokens=8, messages=MESSAGES)
    status, listed, _ = admin_call(keyed_relay, "GET", "/admin/keys")
    assert status == 200
    mine = next(k for k in listed["keys"] if k["id"] == made["id"])
    assert mine["revoked_at"] is not None
    assert "key" not in mine and key[8:] not in json.dumps(listed), "the secret is never listed"


def test_a_key_over_its_requests_per_minute_gets_rate_limit_error_with_retry_after(keyed_relay):
    key = create_key(keyed_relay, requests_per_minute=1)["key"]
    with openai_client(keyed_relay, key) as client:
        assert chat(client) == REPLY
        with pytest.raises(openai.RateLimitError) as limited:
            chat(client)
    assert limited.value.status_code == 429
    assert limited.value.code == "key_rate_limit"
    # One request a minute: the next is allowed within a minute of the first.
    assert 1 <= int(limited.value.response.headers["retry-after"]) <= 60
    with anthropic_client(keyed_relay, api_key=key) as client:
        with pytest.raises(anthropic.RateLimitError) as limited:
            client.messages.create(model=CHAT_MODEL, max_tokens=8, messages=MESSAGES)
    assert limited.value.body["error"]["type"] == "rate_limit_error"


def test_a_key_with_max_concurrent_1_is_refused_while_its_stream_runs_and_served_after(keyed_relay):
    key = create_key(keyed_relay, max_concurrent=1)["key"]
    with openai_client(keyed_relay, key) as client:
        stream = client.chat.completions.create(
            model=CHAT_MODEL, messages=MESSAGES, stream=True, extra_body={"mock_chunk_delay": 0.2}
        )
        pieces = []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                if not pieces:
                    # The stream has started and is not finished: the key's one place is taken.
                    with pytest.raises(openai.RateLimitError) as limited:
                        chat(client)
                    assert limited.value.code == "key_concurrency_limit"
                pieces.append(chunk.choices[0].delta.content)
        assert pieces == REPLY_PIECES, "the running stream is not disturbed by the refusal"
        # The mock pauses after `[DONE]` too, before it ends the response: the request (and the
        # key's place) ends at the relay up to one pause after the client stopped reading.
        deadline = time.monotonic() + 5
        while True:
            try:
                assert chat(client) == REPLY, "the finished stream freed its place"
                break
            except openai.RateLimitError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


def test_a_key_limited_to_one_model_gets_permission_denied_for_another(keyed_relay):
    key = create_key(keyed_relay, models=[EMBED_MODEL])["key"]
    with openai_client(keyed_relay, key) as client:
        with pytest.raises(openai.PermissionDeniedError) as refused:
            chat(client)
        assert refused.value.code == "model_not_allowed"
        assert EMBED_MODEL in refused.value.message, "the refusal says what the key may use"
        assert len(client.embeddings.create(model=EMBED_MODEL, input="hi").data) == 1


def test_usage_by_key_counts_the_key_s_requests_and_survives_a_restart(backend, tmp_path):
    data_dir = tmp_path / "modelrelay-keyed"
    data_dir.mkdir()
    relay = start_keyed_relay(backend, data_dir)
    try:
        made = create_key(relay, name="usage-app")
        other = create_key(relay, name="other-app", requests_per_minute=1)
        with openai_client(relay, made["key"]) as client:
            assert chat(client) == REPLY
        with anthropic_client(relay, api_key=made["key"]) as client:
            client.messages.create(model=CHAT_MODEL, max_tokens=8, messages=MESSAGES)
            # The Anthropic SDK reads a stream to its end, so the relay sees it complete, with the
            # backend's counts (for the OpenAI SDK's early close, see the test below).
            with client.messages.stream(model=CHAT_MODEL, max_tokens=8, messages=MESSAGES) as stream:
                assert list(stream.text_stream) == REPLY_PIECES
        with openai_client(relay, other["key"]) as client:
            chat(client)
            # Refused at the door (429): not served, so not counted.
            with pytest.raises(openai.RateLimitError):
                chat(client)
        row = wait_for_usage(relay, made["id"], 3)
        assert (row["requests"], row["errors"], row["name"]) == (3, 0, "usage-app")
        assert (row["input_tokens"], row["output_tokens"]) == (3 * PROMPT_TOKENS, 3 * COMPLETION_TOKENS)
        assert row["avg_duration_ms"] is not None and row["avg_ttft_ms"] is not None
        assert wait_for_usage(relay, other["id"], 1)["requests"] == 1
        assert usage_row(relay, "anonymous") is None, "with keys required nothing is anonymous"
        assert_clean_exit(relay)
    finally:
        relay.kill()

    relay = start_keyed_relay(backend, data_dir)
    try:
        row = usage_row(relay, made["id"])
        assert row is not None and (row["requests"], row["name"]) == (3, "usage-app"), row
        assert usage_row(relay, other["id"])["requests"] == 1
        status, by_model, _ = admin_call(relay, "GET", f"/admin/usage?group_by=model&key={made['id']}")
        assert status == 200
        assert [(r["group"], r["requests"]) for r in by_model["rows"]] == [(CHAT_MODEL, 3)]
        status, csv, headers = admin_call(relay, "GET", "/admin/usage?group_by=key&format=csv")
        assert status == 200
        assert headers["content-type"] == "text/csv; charset=utf-8"
        assert "attachment" in headers["content-disposition"]
        lines = csv.splitlines()
        assert lines[0] == "key,name,requests,errors,input_tokens,output_tokens,avg_ttft_ms,avg_duration_ms"
        assert any(line.startswith(f"{made['id']},usage-app,3,0,") for line in lines), csv
        # The key was kept too: the same secret still opens the restarted relay, and counts on.
        with openai_client(relay, made["key"]) as client:
            assert chat(client) == REPLY
        assert wait_for_usage(relay, made["id"], 4)["requests"] == 4
        status, listed, _ = admin_call(relay, "GET", "/admin/keys")
        assert {k["id"] for k in listed["keys"]} == {made["id"], other["id"]}
        assert next(k for k in listed["keys"] if k["id"] == made["id"])["last_used_at"] is not None
    finally:
        relay.kill_if_running_after(assert_clean_exit)


def test_an_openai_sdk_stream_read_to_done_is_recorded_with_the_backend_s_token_counts(keyed_relay):
    # The OpenAI SDK hangs up as soon as it reads `[DONE]`; the relay then waits (briefly) for
    # the worker's end of the response instead of counting the stream as cancelled.
    made = create_key(keyed_relay)
    with openai_client(keyed_relay, made["key"]) as client:
        # `mock_chunk_delay`: the mock pauses after every event, `[DONE]` included, so the
        # backend's response ends 0.2 s after the client got the whole answer; the SDK closes
        # the connection as soon as it reads `[DONE]`.
        stream = client.chat.completions.create(
            model=CHAT_MODEL,
            messages=MESSAGES,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"mock_chunk_delay": 0.2},
        )
        chunks = list(stream)
    assert chunks[-1].usage.prompt_tokens == PROMPT_TOKENS, "the client got the whole answer, usage included"
    row = wait_for_usage(keyed_relay, made["id"], 1)
    assert (row["errors"], row["input_tokens"], row["output_tokens"]) == (0, PROMPT_TOKENS, COMPLETION_TOKENS), row


def test_usage_queries_filter_by_day_and_refuse_bad_parameters(keyed_relay):
    made = create_key(keyed_relay)
    with openai_client(keyed_relay, made["key"]) as client:
        chat(client)
    wait_for_usage(keyed_relay, made["id"], 1)
    status, today, _ = admin_call(keyed_relay, "GET", f"/admin/usage?key={made['id']}")
    assert status == 200
    assert today["group_by"] == "day" and today["totals"]["requests"] == 1
    assert [row["group"] for row in today["rows"]] == [today["until"]]
    status, past, _ = admin_call(keyed_relay, "GET", f"/admin/usage?key={made['id']}&since=2020-01-01&until=2020-01-31")
    assert (status, past["rows"], past["totals"]["requests"]) == (200, [], 0)
    # A time names its (UTC) day: a `since` later in the day that `until` names is that day.
    day = today["until"]
    status, same_day, _ = admin_call(keyed_relay, "GET", f"/admin/usage?key={made['id']}&since={day}T23:59:59Z&until={day}")
    assert status == 200, same_day
    assert (same_day["since"], same_day["until"], same_day["totals"]["requests"]) == (day, day, 1)
    for bad in ("group_by=week", "since=yesterday", "since=2026-02-01&until=2026-01-31", "format=xml", "colour=red"):
        status, error, _ = admin_call(keyed_relay, "GET", f"/admin/usage?{bad}")
        assert status == 400, bad
        assert error["error"]["code"] == "invalid_request"


def test_requests_without_a_key_get_401_missing_api_key_in_the_route_s_dialect(keyed_relay):
    body = {"model": CHAT_MODEL, "max_tokens": 8, "messages": MESSAGES}
    status, answer, _ = admin_call(keyed_relay, "POST", "/v1/chat/completions", body, token=None)
    assert (status, answer["error"]["code"]) == (401, "missing_api_key")
    status, answer, _ = admin_call(keyed_relay, "POST", "/v1/messages", body, token=None)
    assert (status, answer["type"], answer["error"]["type"]) == (401, "error", "authentication_error")
    # The admin token is not a client key.
    status, answer, _ = admin_call(keyed_relay, "POST", "/v1/chat/completions", body)
    assert (status, answer["error"]["code"]) == (401, "invalid_api_key")
    status, health, _ = admin_call(keyed_relay, "GET", "/health", token=None)
    assert status == 200 and health["status"] == "ok", "health checks need no key"


def test_the_dashboard_s_api_keys_route_shares_the_keys_and_needs_the_configured_token(keyed_relay):
    made = create_key(keyed_relay)
    status, refused, _ = admin_call(keyed_relay, "GET", "/api/keys", token=None)
    assert (status, refused["error"]["code"]) == (401, "admin_token_required")
    status, listed, _ = admin_call(keyed_relay, "GET", "/api/keys")
    assert status == 200
    assert made["id"] in {k["id"] for k in listed["keys"]}
    status, usage, _ = admin_call(keyed_relay, "GET", "/api/usage?group_by=model")
    assert (status, usage["group_by"]) == (200, "model")


def test_repeated_wrong_admin_tokens_lock_the_address_out_even_with_the_right_one(own_keyed_relay):
    # The relay allows 3 wrong tokens per address (the worker-login limiter's rule), then
    # refuses every token from it for a few seconds.
    for _ in range(3):
        status, wrong, _ = admin_call(own_keyed_relay, "GET", "/admin/keys", token="guess")
        assert (status, wrong["error"]["code"]) == (403, "wrong_admin_token")
    status, locked, headers = admin_call(own_keyed_relay, "GET", "/admin/keys", token=ADMIN_TOKEN)
    assert (status, locked["error"]["code"]) == (403, "admin_locked_out")
    assert 1 <= int(headers["retry-after"]) <= 10


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_admin_keys_is_403_on_a_relay_without_a_configured_admin_token(relay):
    """The shared relay has no MODELRELAY_ADMIN_TOKEN: `/admin` is off, whatever is sent, the
    token it generated for its dashboard included."""
    generated = (relay.data_dir / "admin-token").read_text().strip()
    for method, path, token in [
        ("GET", "/admin/keys", None),
        ("GET", "/admin/keys", generated),
        ("POST", "/admin/keys", generated),
        ("GET", "/admin/usage", generated),
        ("GET", "/admin/workers", None),
    ]:
        args = ["curl", "--silent", "--show-error", "--noproxy", "*", "--max-time", "20", *relay.curl_args()]
        args += ["-X", method, "--write-out", "\n%{http_code}"]
        if token is not None:
            args += ["-H", f"Authorization: Bearer {token}"]
        if method == "POST":
            args += ["-H", "content-type: application/json", "-d", '{"name":"x"}']
        result = subprocess.run([*args, f"{relay.url}{path}"], capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
        body, _, status = result.stdout.rpartition("\n")
        assert status == "403", (method, path, token is not None, body)
        assert "MODELRELAY_ADMIN_TOKEN" in json.loads(body)["error"]["message"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_readme_s_curl_commands_create_use_revoke_a_key_and_download_usage(keyed_relay, tmp_path):
    """The README's commands as a user pastes them: `-d` without a content type, `-OJ`."""
    admin = ["-H", f"Authorization: Bearer {ADMIN_TOKEN}"]

    def curl(*args: str, cwd=None) -> tuple[str, str]:
        result = subprocess.run(
            ["curl", "--silent", "--show-error", "--noproxy", "*", "--max-time", "20", *keyed_relay.curl_args(),
             "--write-out", "\n%{http_code}", *args],
            capture_output=True, text=True, timeout=30, cwd=cwd,
        )
        assert result.returncode == 0, result.stderr
        body, _, status = result.stdout.rpartition("\n")
        return status, body

    status, made = curl(f"{keyed_relay.url}/admin/keys", *admin,
                        "-d", '{"name":"open-webui","models":["%s"],"requests_per_minute":60}' % CHAT_MODEL)
    assert status == "201", made
    made = json.loads(made)
    bearer = ["-H", f"Authorization: Bearer {made['key']}"]
    chat_body = json.dumps({"model": CHAT_MODEL, "messages": [{"role": "user", "content": "Hello!"}]})
    status, answer = curl(f"{keyed_relay.url}/v1/chat/completions", *bearer,
                          "-H", "Content-Type: application/json", "-d", chat_body)
    assert (status, json.loads(answer)["choices"][0]["message"]["content"]) == ("200", REPLY)
    wait_for_usage(keyed_relay, made["id"], 1)
    status, _ = curl("-OJ", f"{keyed_relay.url}/admin/usage?group_by=key&format=csv", *admin, cwd=tmp_path)
    assert status == "200"
    [saved] = tmp_path.glob("modelrelay-usage-*.csv")
    assert f"\n{made['id']},open-webui,1,0," in saved.read_text()
    status, revoked = curl("-X", "DELETE", f"{keyed_relay.url}/admin/keys/{made['id']}", *admin)
    assert (status, json.loads(revoked)["revoked"]) == ("200", True)
    status, refused = curl(f"{keyed_relay.url}/v1/chat/completions", *bearer,
                           "-H", "Content-Type: application/json", "-d", chat_body)
    assert (status, json.loads(refused)["error"]["code"]) == ("401", "invalid_api_key")
