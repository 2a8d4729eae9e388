"""The stack fixture itself: a real gateway in front of the simulator."""

from __future__ import annotations

from tests.support.stack import Stack, chat_body, sse_data


def test_stream_through_gateway(stack: Stack) -> None:
    with stack.client() as client:
        response = client.post("/v1/chat/completions", json=chat_body(stream=True))
    assert response.status_code == 200
    data = sse_data(response.text)
    assert data[-1] == "[DONE]"
    receipt = stack.receipt(response.headers["x-request-id"])
    assert receipt["outcome"] == "complete"
