"""The official `openai` Python SDK against the real relay (base_url=<relay>/v1)."""

from __future__ import annotations

import time

import openai
import pytest

from mock_backend import CHAT_MODEL, COMPLETION_TOKENS, EMBED_DIM, EMBED_MODEL, PROMPT_TOKENS, REPLY, REPLY_PIECES, embedding_for

MESSAGES = [{"role": "user", "content": "Say hello."}]


@pytest.fixture
def client(relay):
    # No retries: a failure must surface as the relay's own answer, not be hidden by a retry.
    with openai.OpenAI(
        base_url=f"{relay.url}/v1", api_key="x", max_retries=0, timeout=20, http_client=relay.http_client(openai)
    ) as client:
        yield client


def test_chat_completion_non_streaming_returns_backend_answer_and_usage(client, seen):
    completion = client.chat.completions.create(model=CHAT_MODEL, messages=MESSAGES)
    assert completion.object == "chat.completion"
    assert completion.model == CHAT_MODEL
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content == REPLY
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.prompt_tokens == PROMPT_TOKENS
    assert completion.usage.completion_tokens == COMPLETION_TOKENS
    forwarded = [r for r in seen() if r["path"] == "/v1/chat/completions"]
    assert len(forwarded) == 1
    assert forwarded[0]["body"]["messages"] == MESSAGES, "the body must reach the backend untouched"
    assert "authorization" not in forwarded[0]["headers"], "the client's key stays with the relay"


def test_chat_completion_stream_delivers_deltas_in_order_then_usage(client):
    stream = client.chat.completions.create(
        model=CHAT_MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks, "no chunk arrived"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1, "every chunk belongs to one completion"
    content_chunks = [c for c in chunks if c.choices]
    assert content_chunks[0].choices[0].delta.role == "assistant"
    deltas = [c.choices[0].delta.content for c in content_chunks if c.choices[0].delta.content]
    assert deltas == REPLY_PIECES, "deltas must arrive complete and in order"
    finishes = [c.choices[0].finish_reason for c in content_chunks if c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None, "the usage chunk comes last"
    assert chunks[-1].usage.total_tokens == PROMPT_TOKENS + COMPLETION_TOKENS


def test_chat_completion_stream_arrives_incrementally_not_buffered(client):
    """With the backend pausing between events, deltas must reach the client as they are made,
    not all at once when the backend finishes."""
    delay = 0.15
    arrivals = []
    stream = client.chat.completions.create(
        model=CHAT_MODEL, messages=MESSAGES, stream=True, extra_body={"mock_chunk_delay": delay}
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.monotonic())
    assert len(arrivals) == len(REPLY_PIECES)
    spread = arrivals[-1] - arrivals[0]
    # The backend spends (pieces - 1) * delay between the first and last delta; allow slack.
    assert spread >= (len(REPLY_PIECES) - 1) * delay * 0.6, f"deltas arrived within {spread:.3f}s: buffered"


def test_legacy_completion_returns_text(client, seen):
    completion = client.completions.create(model=CHAT_MODEL, prompt="Say hello.", max_tokens=8)
    assert completion.object == "text_completion"
    assert completion.choices[0].text == REPLY
    assert completion.usage.total_tokens == PROMPT_TOKENS + COMPLETION_TOKENS
    assert [r["body"]["prompt"] for r in seen() if r["path"] == "/v1/completions"] == ["Say hello."]


def test_embeddings_return_one_vector_per_input(client):
    result = client.embeddings.create(model=EMBED_MODEL, input=["first", "second", "third"])
    assert result.object == "list"
    assert [e.index for e in result.data] == [0, 1, 2]
    for item in result.data:
        assert len(item.embedding) == EMBED_DIM
        assert item.embedding == embedding_for(item.index)


def test_embeddings_as_floats_when_asked(client):
    result = client.embeddings.create(model=EMBED_MODEL, input="only", encoding_format="float")
    assert [e.embedding for e in result.data] == [embedding_for(0)]


def test_responses_create_non_streaming_returns_output_text(client, seen):
    response = client.responses.create(model=CHAT_MODEL, input="Say hello.")
    assert response.object == "response"
    assert response.id.startswith("resp_")
    assert response.status == "completed"
    assert response.output_text == REPLY
    assert response.usage.input_tokens == PROMPT_TOKENS
    assert response.usage.output_tokens == COMPLETION_TOKENS
    assert [r["body"]["input"] for r in seen() if r["path"] == "/v1/responses"] == ["Say hello."]


@pytest.mark.parametrize("llama_events", [False, True], ids=["complete-events", "llama-server-events"])
def test_responses_stream_helper_accumulates_text_and_final_response(client, seen, llama_events):
    """With `llama_events` the backend streams as llama-server does, without the `output_index`,
    `content_index` and `sequence_number` the helper indexes its snapshot with: the relay fills
    them in from the stream's structure."""
    deltas = []
    event_types = []
    extra_body = {"mock_llama_events": True} if llama_events else None
    with client.responses.stream(model=CHAT_MODEL, input="Say hello.", extra_body=extra_body) as stream:
        for event in stream:
            event_types.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
                assert (event.output_index, event.content_index, event.snapshot) == (0, 0, "".join(deltas))
        final = stream.get_final_response()
    sent = [r["body"] for r in seen() if r["path"] == "/v1/responses"]
    assert [body.get("mock_llama_events", False) for body in sent] == [llama_events], "the backend streamed as asked"
    assert deltas == REPLY_PIECES
    assert event_types[0] == "response.created"
    assert event_types[-1] == "response.completed"
    assert "response.output_text.done" in event_types
    assert final.status == "completed"
    assert final.output_text == REPLY


def test_responses_create_with_stream_true_yields_ordered_events(client):
    events = list(client.responses.create(model=CHAT_MODEL, input="Say hello.", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events))), "sequence numbers in order, none lost"
    assert events[0].type == "response.created"
    assert events[-1].type == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == REPLY
    assert events[-1].response.output_text == REPLY


def test_models_list_shows_backend_models(client):
    ids = {model.id for model in client.models.list()}
    assert {CHAT_MODEL, EMBED_MODEL} <= ids


def test_a_model_no_worker_serves_times_out_in_the_queue_with_a_504_naming_it(client):
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    error = caught.value
    assert error.status_code == 504
    assert error.code == "queue_timeout"
    assert "no-such-model" in error.message


def test_a_model_no_worker_serves_in_stream_raises_before_any_chunk(client):
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES, stream=True)
    assert caught.value.status_code == 504


def test_empty_model_raises_bad_request(client, seen):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="", messages=MESSAGES)
    assert caught.value.status_code == 400
    assert caught.value.code == "invalid_model"
    assert "model" in caught.value.message
    assert not [r for r in seen() if r["path"] == "/v1/chat/completions"], "a bad request must not reach the backend"


def test_non_string_model_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=CHAT_MODEL, messages=MESSAGES, extra_body={"model": 42})
    assert caught.value.code == "invalid_model"
