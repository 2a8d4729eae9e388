"""``POST /v1/images/generations``: the descriptor and the request's planning.

Fields (OpenAI's shape): ``model`` (an alias), ``prompt`` (required, text,
within ``max_prompt_bytes``), ``n`` (1 to ``images.max_n``, default 1),
``size`` (``"<w>x<h>"``, default ``1024x1024``), ``response_format``
(``b64_json`` default, or ``url``: needs ``server.public_base_url``);
``quality``, ``style`` and ``user`` are accepted and dropped; anything else
is ``unsupported_field``. A malformed ``n``, ``size`` or ``response_format``
is ``invalid_request`` naming it; a size off the bounds (each side a multiple
of 16, at least 64, at most ``images.max_side``, w x h at most
``images.max_pixels``) is ``media_limit_exceeded`` (``param: size``).

The worker makes one image per call, whatever ``n`` says (agents-media §1),
so the plan makes ``n`` worker calls (:attr:`Plan.calls`), each its own
permit of ``cost.image_generation`` and its own count against
``requests_per_minute``. Each call's body is the same: the route, the prompt,
``"response_format": "B64Json"`` (never ``Url``: the worker writes that file
into its working directory and never deletes it) and the explicit ``width``
and ``height``.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from gateway.apis.base import (
    Dialect,
    Endpoint,
    Plan,
    PlanContext,
    StreamBounds,
    check_prompt,
    require_object,
    require_text_modality,
    resolve_alias,
)
from gateway.apis.fields import Spec, enum, harmless, integer, invalid, obj, string, text_size
from gateway.apis.images.answer import ImageRequest, ImagesDialect
from gateway.config.media import IMAGE_SIDE_STEP, MIN_IMAGE_SIDE
from gateway.core.errors import GatewayError

DEFAULT_SIZE = "1024x1024"
_SIZE = re.compile(r"([1-9][0-9]{0,5})x([1-9][0-9]{0,5})")

FIELDS: dict[str, Spec] = {
    "model": string,
    "prompt": string,
    "n": integer(ge=1),
    "size": string,
    "response_format": enum("b64_json", "url"),
    "quality": harmless,
    "style": harmless,
    "user": harmless,
}
BODY = obj(FIELDS, required=("model", "prompt"))


def parse_size(value: str, ctx: PlanContext) -> tuple[int, int]:
    """(width, height) of a ``"<w>x<h>"`` size, within the configured bounds."""
    found = _SIZE.fullmatch(value)
    if found is None:
        raise invalid("size", 'must be "<width>x<height>" in pixels')
    width, height = int(found[1]), int(found[2])
    limits = ctx.images
    sides_ok = all(
        MIN_IMAGE_SIDE <= side <= limits.max_side and side % IMAGE_SIDE_STEP == 0
        for side in (width, height)
    )
    if not sides_ok or width * height > limits.max_pixels:
        raise GatewayError(
            "media_limit_exceeded",
            f"size must have sides that are multiples of {IMAGE_SIDE_STEP} from "
            f"{MIN_IMAGE_SIDE} to {limits.max_side} and at most {limits.max_pixels} pixels.",
            param="size",
        )
    return width, height


class ImagesApi:
    endpoint: ClassVar[Endpoint] = Endpoint(
        name="images",
        path="/v1/images/generations",
        operation="generate_content",
        media_param="prompt",
        exchange="json",
        route_kinds=frozenset({"image"}),
        cost="image_generation",
        worker_rejection="relayed",
    )

    def plan(self, body: Any, ctx: PlanContext) -> Plan:
        tenant = ctx.tenant
        clean: dict[str, Any] = BODY(require_object(body), "")
        alias = resolve_alias(clean, ctx)
        n = clean.get("n", 1)
        if n > ctx.images.max_n:
            raise invalid("n", f"must be from 1 to {ctx.images.max_n}")
        width, height = parse_size(clean.get("size", DEFAULT_SIZE), ctx)
        url = clean.get("response_format") == "url"
        if url and ctx.public_base_url is None:
            raise GatewayError(
                "unsupported_field",
                "response_format url is not served by this gateway (no public base URL is "
                "configured); use b64_json.",
                param="response_format",
            )
        require_text_modality(tenant, "prompt")
        prompt_bytes = text_size(clean["prompt"])
        check_prompt(prompt_bytes, tenant, "prompt")
        return Plan(
            endpoint=self.endpoint.name,
            alias=alias,
            body={"prompt": clean["prompt"], "width": width, "height": height},
            stream=False,
            include_usage=False,
            max_tokens=None,
            prompt_bytes=prompt_bytes,
            nonce=ctx.nonce,
            bills_tokens=False,
            calls=n,
            detail=ImageRequest(width, height, url, ctx.images.max_bytes),
        )

    def forward(self, plan: Plan, route: str) -> dict[str, Any]:
        body = plan.body
        return {
            "model": route,
            "prompt": body["prompt"],
            "response_format": "B64Json",
            "width": body["width"],
            "height": body["height"],
        }

    def dialect(self, plan: Plan, bounds: StreamBounds, *, collect: bool) -> Dialect:
        return ImagesDialect(plan.detail, plan.nonce)
