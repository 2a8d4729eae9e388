"""The request's span, from its receipt: GenAI semantic-convention attributes.

What a span may carry is stricter than the receipts' rule (``observe/tracing.py``):
counts, names, codes and identifiers, never prompt or answer text, tokens or
paths; this is the one place that picks them.
"""

from __future__ import annotations

from gateway.apis.usage import Usage
from gateway.books.receipts import Receipt
from gateway.observe.tracing import NS, PROVIDER, AttributeValue


def request_attributes(receipt: Receipt, operation: str) -> dict[str, AttributeValue | None]:
    """GenAI semantic-convention attributes of one inference request, from its receipt."""
    usage = receipt.usage if isinstance(receipt.usage, Usage) else None
    attributes: dict[str, AttributeValue | None] = {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.request.model": receipt.model_alias,
        "gen_ai.request.max_tokens": receipt.max_tokens,
        "gen_ai.usage.input_tokens": usage.prompt_tokens if usage is not None else None,
        "gen_ai.usage.output_tokens": usage.completion_tokens if usage is not None else None,
        "gen_ai.response.finish_reasons": (
            [receipt.finish_reason] if receipt.finish_reason is not None else None
        ),
        NS + "upstream": receipt.upstream,
        NS + "stream": receipt.stream,
        NS + "outcome": receipt.outcome,
        NS + "usage_source": usage.source if usage is not None else None,
        NS + "ttft_ms": receipt.ttft_ms,
    }
    if isinstance(receipt.usage, dict):
        # What an images or speech answer made (spec §23): {"images": n} or {"audio_ms": ms}.
        attributes.update({NS + key: value for key, value in receipt.usage.items()})
    return attributes
