"""The official SDKs through the relay in front of a backend that speaks only chat completions:
the worker translates Anthropic Messages and OpenAI Responses, and the proxy's store serves
`previous_response_id`. Claude model names reach the mock's model through a `claude-*` alias.
"""

from __future__ import annotations

import anthropic
import openai
import pytest

from mock_backend import CHAT_MODEL, COMPLETION_TOKENS, PROMPT_TOKENS, REPLY, REPLY_PIECES, TOOL_CALL_ID

CLAUDE_MODEL = "claude-opus-5-5"  # what Claude Code sends (shared/research/clients.md)
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather for a place",
    "input_schema": {
        "type": "object",
        "properties": {"location": {"type": "string"}},
        "required": ["location"],
    },
}
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}


@pytest.fixture
def claude(chat_relay):
    with anthropic.Anthropic(base_url=chat_relay.url, api_key="x", max_retries=0, timeout=20) as client:
        yield client


@pytest.fixture
def oai(chat_relay):
    with openai.OpenAI(base_url=f"{chat_relay.url}/v1", api_key="x", max_retries=0, timeout=20) as client:
        yield client


def chat_requests(seen) -> list[dict]:
    return [r["body"] for r in seen() if r["method"] == "POST" and r["path"] == "/v1/chat/completions"]


def roles_and_texts(chat_body: dict) -> list[tuple[str, str]]:
    """A chat request's conversation as (role, text) pairs."""
    out = []
    for message in chat_body["messages"]:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content)
        out.append((message["role"], content or ""))
    return out


# -- Anthropic Messages --------------------------------------------------------------------------


def test_anthropic_messages_create_is_translated_for_a_chat_only_backend(claude, chat_seen):
    message = claude.messages.create(model=CLAUDE_MODEL, max_tokens=64, messages=[QUESTION])
    assert message.type == "message"
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == REPLY
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens == PROMPT_TOKENS
    assert message.usage.output_tokens == COMPLETION_TOKENS
    (chat,) = chat_requests(chat_seen)
    assert chat["model"] == CHAT_MODEL, "the alias named the served model"
    assert roles_and_texts(chat) == [("user", QUESTION["content"])]


def test_anthropic_messages_stream_is_translated_event_by_event(claude):
    with claude.messages.stream(model=CLAUDE_MODEL, max_tokens=64, messages=[QUESTION]) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert pieces == REPLY_PIECES
    assert final.content[0].text == REPLY
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == COMPLETION_TOKENS


def test_anthropic_raw_stream_has_the_full_event_sequence(claude):
    events = list(claude.messages.create(model=CLAUDE_MODEL, max_tokens=64, messages=[QUESTION], stream=True))
    types = [event.type for event in events]
    assert types[0] == "message_start"
    assert types[1] == "content_block_start"
    assert types[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert types.count("content_block_delta") == len(REPLY_PIECES)


def test_anthropic_tool_use_round_trip_streaming(claude, chat_seen):
    """Claude Code's loop: a streamed tool_use answer, the tool's result sent back, a final text."""
    with claude.messages.stream(
        model=CLAUDE_MODEL,
        max_tokens=1024,
        tools=[WEATHER_TOOL],
        messages=[QUESTION],
        extra_headers={"anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14"},
    ) as stream:
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use"
    (tool_use,) = [block for block in first.content if block.type == "tool_use"]
    assert tool_use.name == "get_weather"
    assert tool_use.input == {"location": "mock location"}

    with claude.messages.stream(
        model=CLAUDE_MODEL,
        max_tokens=1024,
        tools=[WEATHER_TOOL],
        messages=[
            QUESTION,
            {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "sunny, 21 C"}],
            },
        ],
    ) as stream:
        second = stream.get_final_message()
    assert second.stop_reason == "end_turn"
    assert second.content[0].text == REPLY

    chats = chat_requests(chat_seen)
    assert len(chats) == 2
    assert chats[0]["stream"] is True
    assert chats[0]["tools"][0]["function"]["name"] == "get_weather"
    messages = chats[1]["messages"]
    assert messages[1]["tool_calls"][0]["id"] == tool_use.id
    assert messages[2] == {"role": "tool", "tool_call_id": tool_use.id, "content": "sunny, 21 C"}


def test_anthropic_tool_use_round_trip_non_streaming(claude):
    first = claude.messages.create(model=CLAUDE_MODEL, max_tokens=256, tools=[WEATHER_TOOL], messages=[QUESTION])
    assert first.stop_reason == "tool_use"
    (tool_use,) = first.content
    assert tool_use.type == "tool_use"
    assert tool_use.input == {"location": "mock location"}
    second = claude.messages.create(
        model=CLAUDE_MODEL,
        max_tokens=256,
        tools=[WEATHER_TOOL],
        messages=[
            QUESTION,
            {"role": "assistant", "content": [tool_use.model_dump()]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "sunny"}]},
        ],
    )
    assert second.content[0].text == REPLY


def test_anthropic_count_tokens_is_estimated(claude, chat_seen):
    result = claude.messages.count_tokens(model=CLAUDE_MODEL, messages=[{"role": "user", "content": "x" * 40}])
    assert result.input_tokens == 10, "characters / 4"
    assert not chat_requests(chat_seen), "counting does not generate"


def test_anthropic_unsupported_content_is_a_400_naming_the_field(claude, chat_seen):
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model=CLAUDE_MODEL,
            max_tokens=16,
            messages=[{"role": "user", "content": [{"type": "audio", "source": {"type": "base64", "data": "AAAA"}}]}],
        )
    assert caught.value.status_code == 400
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert caught.value.body["error"]["message"] == "messages[0].content[0].type: audio is not supported"
    assert not chat_requests(chat_seen)


# -- OpenAI Chat and Responses -------------------------------------------------------------------


def test_openai_chat_passes_through_to_a_chat_only_backend(oai):
    completion = oai.chat.completions.create(model=CHAT_MODEL, messages=[QUESTION])
    assert completion.choices[0].message.content == REPLY
    pieces = [
        chunk.choices[0].delta.content
        for chunk in oai.chat.completions.create(model=CHAT_MODEL, messages=[QUESTION], stream=True)
        if chunk.choices and chunk.choices[0].delta.content
    ]
    assert "".join(pieces) == REPLY


def test_openai_responses_previous_response_id_continues_the_conversation(oai, chat_seen):
    first = oai.responses.create(model=CHAT_MODEL, instructions="Be brief.", input="My name is Ada.")
    assert first.output_text == REPLY
    second = oai.responses.create(model=CHAT_MODEL, previous_response_id=first.id, input="What is my name?")
    assert second.output_text == REPLY
    assert second.previous_response_id == first.id
    chats = chat_requests(chat_seen)
    assert roles_and_texts(chats[1]) == [
        ("user", "My name is Ada."),
        ("assistant", REPLY),
        ("user", "What is my name?"),
    ]


def test_openai_responses_stream_helper_then_continue_from_the_streamed_response(oai, chat_seen):
    deltas = []
    with oai.responses.stream(model=CHAT_MODEL, input="Say hello.") as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert deltas == REPLY_PIECES
    assert final.status == "completed"
    assert final.output_text == REPLY
    assert final.usage.input_tokens == PROMPT_TOKENS

    events = list(oai.responses.create(model=CHAT_MODEL, previous_response_id=final.id, input="Again.", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    assert roles_and_texts(chat_requests(chat_seen)[1]) == [
        ("user", "Say hello."),
        ("assistant", REPLY),
        ("user", "Again."),
    ]


def test_openai_responses_streamed_continuation_echoes_previous_response_id(oai):
    first = oai.responses.create(model=CHAT_MODEL, input="One.")
    events = list(oai.responses.create(model=CHAT_MODEL, previous_response_id=first.id, input="Two.", stream=True))
    with_response = [e for e in events if e.type in ("response.created", "response.in_progress", "response.completed")]
    assert [e.type for e in with_response] == ["response.created", "response.in_progress", "response.completed"]
    assert all(e.response.previous_response_id == first.id for e in with_response)


def test_openai_responses_input_items_list_the_whole_context(oai):
    first = oai.responses.create(model=CHAT_MODEL, instructions="Be brief.", input="My name is Ada.")
    second = oai.responses.create(model=CHAT_MODEL, previous_response_id=first.id, input="What is my name?")
    newest_first = oai.responses.input_items.list(second.id)
    assert [item.role for item in newest_first.data] == ["user", "assistant", "user"]
    assert newest_first.data[0].content[0].text == "What is my name?"
    assert newest_first.data[1].content[0].text == REPLY
    assert newest_first.first_id == newest_first.data[0].id
    assert newest_first.has_more is False
    # The SDK's auto-paging follows `after` one item at a time.
    oldest_first = [item.id for item in oai.responses.input_items.list(second.id, order="asc", limit=1)]
    assert oldest_first == [item.id for item in reversed(newest_first.data)]
    with pytest.raises(openai.NotFoundError):
        oai.responses.input_items.list("resp_unknown")


def test_openai_responses_function_call_round_trip(oai, chat_seen):
    tool = {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
    }
    first = oai.responses.create(model=CHAT_MODEL, input="Weather in Paris?", tools=[tool])
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather"
    assert call.arguments == '{"location": "mock location"}'
    second = oai.responses.create(
        model=CHAT_MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        tools=[tool],
    )
    assert second.output_text == REPLY
    messages = chat_requests(chat_seen)[1]["messages"]
    assert messages[1]["tool_calls"][0]["id"] == TOOL_CALL_ID
    assert messages[2] == {"role": "tool", "tool_call_id": TOOL_CALL_ID, "content": "sunny"}


def test_openai_responses_retrieve_and_delete(oai):
    created = oai.responses.create(model=CHAT_MODEL, input="keep me")
    fetched = oai.responses.retrieve(created.id)
    assert fetched.id == created.id
    assert fetched.output_text == REPLY
    oai.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError) as caught:
        oai.responses.create(model=CHAT_MODEL, previous_response_id=created.id, input="still there?")
    assert caught.value.code == "previous_response_not_found"


def test_openai_responses_store_false_is_not_kept(oai):
    created = oai.responses.create(model=CHAT_MODEL, input="forget me", store=False)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(created.id)
