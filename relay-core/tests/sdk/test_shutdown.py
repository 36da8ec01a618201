"""Graceful shutdown of the real relay while a client is mid-stream."""

from __future__ import annotations

import signal

import openai

from conftest import SHUTDOWN_TIMEOUT
from mock_backend import CHAT_MODEL, REPLY_PIECES


def test_sigterm_lets_an_in_flight_stream_finish_then_exits_0(own_relay):
    client = openai.OpenAI(base_url=f"{own_relay.url}/v1", api_key="x", max_retries=0, timeout=20)
    stream = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        extra_body={"mock_chunk_delay": 0.1},
    )
    pieces = []
    finish = None
    signalled = False
    for chunk in stream:
        if not chunk.choices:
            continue
        if chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
            if not signalled:
                own_relay.process.send_signal(signal.SIGTERM)
                signalled = True
        finish = chunk.choices[0].finish_reason or finish
    assert signalled
    assert pieces == REPLY_PIECES, "the stream in flight at SIGTERM must finish intact"
    assert finish == "stop"
    code = own_relay.process.wait(timeout=SHUTDOWN_TIMEOUT)
    assert code == 0, own_relay.output()
    client.close()
