"""The official OpenAI SDK against models served by an Anthropic upstream (`[[proxy.upstreams]]`
of kind `anthropic`): the proxy translates Chat Completions and Responses requests to Anthropic
Messages and the answers back. The upstream is the mock backend, which speaks Messages natively;
the relay's own worker serves the chat-only backend, which never sees these requests.
"""

from __future__ import annotations

import openai
import pytest

from conftest import assert_clean_exit, seen_reader, start_relay
from mock_backend import COMPLETION_TOKENS, PROMPT_TOKENS, REPLY, REPLY_PIECES

UPSTREAM_MODEL = "claude-up-1"
UPSTREAM_KEY = "sk-ant-sdk-test"


@pytest.fixture(scope="session")
def upstream_relay(chat_backend, backend, tmp_path_factory):
    """A relay whose `claude-up-*` models go to the mock backend as an Anthropic upstream."""
    config = f'''[[proxy.upstreams]]
name = "claude-cloud"
kind = "anthropic"
base_url = "{backend.url}"
api_key = "{UPSTREAM_KEY}"
models = ["claude-up-*"]
'''
    relay = start_relay(chat_backend, tmp_path_factory.mktemp("modelrelay-upstream"), config)
    try:
        yield relay
    finally:
        relay.kill_if_running_after(assert_clean_exit)


@pytest.fixture
def oai(upstream_relay):
    with openai.OpenAI(base_url=f"{upstream_relay.url}/v1", api_key="client-key", max_retries=0, timeout=20) as client:
        yield client


@pytest.fixture
def upstream_seen(backend):
    """The upstream's (the mock backend's) request log, cleared for this test."""
    return seen_reader(backend)


def messages_requests(seen) -> list[dict]:
    return [r for r in seen() if r["method"] == "POST" and r["path"] == "/v1/messages"]


def test_chat_completion_for_an_anthropic_upstream_is_translated_both_ways(oai, upstream_seen, chat_seen):
    completion = oai.chat.completions.create(
        model=UPSTREAM_MODEL,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
    )
    assert completion.object == "chat.completion"
    assert completion.model == UPSTREAM_MODEL
    assert completion.choices[0].message.content == REPLY
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.prompt_tokens == PROMPT_TOKENS
    assert completion.usage.completion_tokens == COMPLETION_TOKENS
    (sent,) = messages_requests(upstream_seen)
    assert sent["headers"]["x-api-key"] == UPSTREAM_KEY, "the upstream's key, not the client's"
    assert "authorization" not in sent["headers"]
    assert sent["body"]["system"] == [{"type": "text", "text": "Be brief."}]
    assert sent["body"]["max_tokens"] > 0
    assert chat_seen() == [], "the worker's backend is not involved"


def test_chat_completion_stream_from_an_anthropic_upstream(oai):
    stream = oai.chat.completions.create(
        model=UPSTREAM_MODEL,
        messages=[{"role": "user", "content": "Stream it"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert deltas == REPLY_PIECES
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.total_tokens == PROMPT_TOKENS + COMPLETION_TOKENS


def test_responses_stream_helper_with_an_anthropic_upstream(oai, upstream_seen):
    with oai.responses.stream(model=UPSTREAM_MODEL, input="Say hello.") as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert deltas == REPLY_PIECES
    assert final.output_text == REPLY
    assert final.status == "completed"
    continued = oai.responses.create(model=UPSTREAM_MODEL, previous_response_id=final.id, input="Again.")
    assert continued.previous_response_id == final.id
    sent = messages_requests(upstream_seen)[-1]["body"]
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
