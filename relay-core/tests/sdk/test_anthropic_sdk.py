"""The official `anthropic` Python SDK against the real relay (base_url=<relay>)."""

from __future__ import annotations

import time

import anthropic
import pytest

from mock_backend import CHAT_MODEL, COMPLETION_TOKENS, PROMPT_TOKENS, REPLY, REPLY_PIECES

MESSAGES = [{"role": "user", "content": "Say hello to the relay."}]


@pytest.fixture
def client(relay):
    with anthropic.Anthropic(
        base_url=relay.url, api_key="x", max_retries=0, timeout=20, http_client=relay.http_client(anthropic)
    ) as client:
        yield client


def test_messages_create_non_streaming_returns_text_and_usage(client):
    message = client.messages.create(model=CHAT_MODEL, max_tokens=64, messages=MESSAGES)
    assert message.type == "message"
    assert message.role == "assistant"
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == REPLY
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens == PROMPT_TOKENS
    assert message.usage.output_tokens == COMPLETION_TOKENS


def test_messages_stream_collects_text_in_order_and_final_message(client):
    with client.messages.stream(model=CHAT_MODEL, max_tokens=64, messages=MESSAGES) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert pieces == REPLY_PIECES
    assert final.content[0].text == REPLY
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == COMPLETION_TOKENS


def test_messages_stream_raw_events_keep_the_full_sequence(client):
    stream = client.messages.create(model=CHAT_MODEL, max_tokens=64, messages=MESSAGES, stream=True)
    types = [event.type for event in stream]
    assert types[0] == "message_start"
    assert types[1] == "content_block_start"
    assert types[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert types.count("content_block_delta") == len(REPLY_PIECES)


def test_count_tokens_returns_backend_count(client, seen):
    result = client.messages.count_tokens(model=CHAT_MODEL, messages=MESSAGES)
    assert result.input_tokens == len(MESSAGES[0]["content"].split())
    assert [r["path"] for r in seen() if r["path"].startswith("/v1/messages")] == ["/v1/messages/count_tokens"]


def test_models_list_in_anthropic_shape(client):
    models = list(client.models.list())
    assert CHAT_MODEL in {m.id for m in models}
    assert all(m.type == "model" for m in models)


def test_a_model_no_worker_serves_times_out_in_the_queue_with_a_504_naming_it(client):
    # (A Claude name would be answered by the served model: the next test.)
    with pytest.raises(anthropic.InternalServerError) as caught:
        client.messages.create(model="no-such-model", max_tokens=16, messages=MESSAGES)
    assert caught.value.status_code == 504
    body = caught.value.body
    assert body["type"] == "error"
    assert body["error"]["type"] == "timeout_error"
    assert "no-such-model" in body["error"]["message"]
    assert CHAT_MODEL in body["error"]["message"], "the 504 says what is served"


def test_a_claude_name_nobody_serves_is_answered_by_the_served_model_at_once(client, seen):
    """Claude Code with nothing but the URL: the Claude name it asks for goes to the chat model
    the relay chooses, with no queue timeout first."""
    started = time.monotonic()
    message = client.messages.create(model="claude-opus-5-5", max_tokens=16, messages=MESSAGES)
    assert time.monotonic() - started < 5
    assert message.content
    forwarded = [r for r in seen() if r["path"] in ("/v1/messages", "/v1/chat/completions")]
    assert forwarded[-1]["body"]["model"] == CHAT_MODEL


def test_relay_forwards_the_sdk_version_headers_and_keeps_its_credentials(client, seen):
    """The SDK's `anthropic-version` reaches the backend unchanged; its credential (this SDK
    version sends the key as `Authorization: Bearer`) stays with the relay by default, so the
    shared worker secret never hands a worker the users' keys."""
    sdk_auth = {name.lower(): value for name, value in client.auth_headers.items()}
    sdk_version = client.default_headers["anthropic-version"]
    assert sdk_auth, "the SDK sends some credential"
    client.messages.create(model=CHAT_MODEL, max_tokens=16, messages=MESSAGES)
    forwarded = [r for r in seen() if r["path"] == "/v1/messages"]
    assert len(forwarded) == 1
    headers = forwarded[0]["headers"]
    for name in sdk_auth:
        assert name not in headers, f"{name} reached the backend: {headers}"
    assert headers.get("anthropic-version") == sdk_version
    assert forwarded[0]["body"]["messages"] == MESSAGES
    assert forwarded[0]["body"]["max_tokens"] == 16


def test_relay_forwards_anthropic_version_and_beta_but_not_x_api_key(client, seen):
    """Claude Code style: `x-api-key`, a pinned `anthropic-version` and `anthropic-beta` flags;
    the key stays with the relay unless forwarding is turned on."""
    client.messages.create(
        model=CHAT_MODEL,
        max_tokens=16,
        messages=MESSAGES,
        extra_headers={
            "x-api-key": "sk-relay-test",
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
        },
    )
    forwarded = [r for r in seen() if r["path"] == "/v1/messages"]
    assert len(forwarded) == 1
    headers = forwarded[0]["headers"]
    assert "x-api-key" not in headers, headers
    assert headers.get("anthropic-version") == "2023-06-01"
    assert headers.get("anthropic-beta") == "claude-code-20250219,interleaved-thinking-2025-05-14"


def test_a_relay_that_opts_in_forwards_the_sdk_credentials(backend, tmp_path):
    """With `FORWARD_CLIENT_AUTH=true` (for backends that check the users' keys) the proxy
    passes the credentials to its workers and the worker to its backend."""
    from conftest import assert_clean_exit, seen_reader, start_relay

    data_dir = tmp_path / "modelrelay-data"
    data_dir.mkdir()
    relay = start_relay(backend, data_dir, extra_env={"FORWARD_CLIENT_AUTH": "true"})
    try:
        seen = seen_reader(backend)
        with anthropic.Anthropic(base_url=relay.url, api_key="sk-user", max_retries=0, timeout=20) as client:
            client.messages.create(
                model=CHAT_MODEL, max_tokens=16, messages=MESSAGES, extra_headers={"x-api-key": "sk-ant-user"}
            )
        forwarded = [r for r in seen() if r["path"] == "/v1/messages"]
        assert len(forwarded) == 1
        assert forwarded[0]["headers"].get("x-api-key") == "sk-ant-user", forwarded[0]["headers"]
    finally:
        relay.kill_if_running_after(assert_clean_exit)
