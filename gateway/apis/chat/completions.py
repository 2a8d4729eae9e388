"""``POST /v1/completions``: the legacy text-completion dialect.

``prompt`` is one string (what the worker accepts); the worker's chunks carry
no usage at all (reference §3.5), so usage is always estimated and said so
(``x-usage-source: estimated``, spec §14): completion tokens are the content
chunks received, never more than ``max_tokens``. A stream that asked for
``stream_options.include_usage`` gets that estimate as the final usage chunk
(``choices: []``) before ``data: [DONE]`` (``chunks.ChunkDialect``).
"""

from __future__ import annotations

from typing import Any, ClassVar

from gateway.apis.base import (
    Dialect,
    Endpoint,
    Plan,
    PlanContext,
    StreamBounds,
    check_prompt,
    output_bound,
    require_object,
    require_text_modality,
    resolve_alias,
    stream_flags,
)
from gateway.apis.chat.dialect import ChunkDialect
from gateway.apis.fields import Spec, boolean, integer, obj, string, text_size
from gateway.apis.sampling import REFUSED_FIELDS, SAMPLING, check_single_choice, compiled_bytes

FIELDS: dict[str, Spec] = {
    **SAMPLING,
    "prompt": string,
    "echo": boolean,
    "best_of": integer(),
    "suffix": string,
    "logprobs": integer(ge=0, le=20),
}
#: the names a request body may carry (spec §5: the allowlist)
FIELD_NAMES = frozenset(FIELDS)

BODY = obj(
    FIELDS,
    required=("model", "prompt"),
    refused=REFUSED_FIELDS,
)


class CompletionsApi:
    endpoint: ClassVar[Endpoint] = Endpoint(
        name="completions",
        path="/v1/completions",
        operation="text_completion",
        media_param="prompt",
    )

    def plan(self, body: Any, ctx: PlanContext) -> Plan:
        tenant = ctx.tenant
        clean: dict[str, Any] = BODY(require_object(body), "")
        alias = resolve_alias(clean, ctx)
        check_single_choice(clean)
        stream, include_usage = stream_flags(clean)
        prompt = text_size(clean["prompt"]) + text_size(clean.get("suffix") or "")
        if clean["prompt"] or clean.get("suffix"):
            require_text_modality(tenant, "prompt")
        prompt += compiled_bytes(clean)
        check_prompt(prompt, tenant, "prompt")
        return Plan(
            endpoint=self.endpoint.name,
            alias=alias,
            body=clean,
            stream=stream,
            include_usage=include_usage,
            max_tokens=output_bound(clean, tenant, ("max_tokens",)),
            prompt_bytes=prompt,
            nonce=ctx.nonce,
        )

    def forward(self, plan: Plan, route: str) -> dict[str, Any]:
        body = dict(plan.body)
        body["model"] = route
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        body["max_tokens"] = plan.max_tokens
        return body

    def dialect(self, plan: Plan, bounds: StreamBounds, *, collect: bool) -> Dialect:
        return ChunkDialect("completion", plan, bounds, collect=collect)
