"""The gateway's one error type and the only place statuses are chosen.

Every refusal is a :class:`GatewayError` carrying a stable ``code`` from the
contract (spec §6, §12). The code alone decides the HTTP status and the
OpenAI ``type``, so OpenAI SDKs raise the matching exception class. Messages
are fixed texts written here or by the raiser; they never echo caller data
(tokens, keys, prompts, paths), and no status is ever derived from a message.

Pure: no I/O library is imported, so the SSE validator and the rewriter can
raise these too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

#: every code of the contract (spec §6, §12 and after): mypy checks each raise
ErrorCode = Literal[
    "invalid_json",
    "invalid_request",
    "unsupported_field",
    "caller_url_forbidden",
    "media_limit_exceeded",
    "prompt_too_large",
    "output_tokens_exceeded",
    "modality_not_allowed",
    "admission_weight_exceeded",
    "upstream_rejected",
    "approval_requires_events",
    "model_not_capable",
    "missing_credentials",
    "invalid_token",
    "tenant_not_configured",
    "insufficient_scope",
    "endpoint_not_allowed",
    "issuer_not_allowed",
    "evidence_quota_exceeded",
    "tool_not_allowed",
    "model_not_found",
    "evidence_not_found",
    "response_not_found",
    "not_found",
    "approval_not_found",
    "file_not_found",
    "method_not_allowed",
    "evidence_in_use",
    "approval_resolved",
    "request_timeout",
    "body_too_large",
    "unsupported_media_type",
    "headers_too_large",
    "rate_limited",
    "queue_full",
    "admission_timeout",
    "budget_exhausted",
    "concurrency_limited",
    "internal_error",
    "storage_error",
    "upstream_unavailable",
    "upstream_protocol_error",
    "upstream_error",
    "upstream_not_ready",
    "audit_unavailable",
    "limits_unavailable",
    "state_unavailable",
    "upstream_timeout",
    "agent_run_timeout",
    "http_version_not_supported",
]

# code -> (HTTP status, OpenAI error type)
_CODES: dict[ErrorCode, tuple[int, str]] = {
    "invalid_json": (400, "invalid_request_error"),
    "invalid_request": (400, "invalid_request_error"),
    "unsupported_field": (400, "invalid_request_error"),
    "caller_url_forbidden": (400, "invalid_request_error"),
    "media_limit_exceeded": (400, "invalid_request_error"),
    "prompt_too_large": (400, "invalid_request_error"),
    "output_tokens_exceeded": (400, "invalid_request_error"),
    "modality_not_allowed": (400, "invalid_request_error"),
    "admission_weight_exceeded": (400, "invalid_request_error"),
    "upstream_rejected": (400, "invalid_request_error"),
    "approval_requires_events": (400, "invalid_request_error"),
    "model_not_capable": (400, "invalid_request_error"),
    "missing_credentials": (401, "authentication_error"),
    "invalid_token": (401, "authentication_error"),
    "tenant_not_configured": (403, "permission_error"),
    "insufficient_scope": (403, "permission_error"),
    "endpoint_not_allowed": (403, "permission_error"),
    "issuer_not_allowed": (403, "permission_error"),
    "evidence_quota_exceeded": (403, "permission_error"),
    "tool_not_allowed": (403, "permission_error"),
    "model_not_found": (404, "not_found_error"),
    "evidence_not_found": (404, "not_found_error"),
    "response_not_found": (404, "not_found_error"),
    "not_found": (404, "not_found_error"),
    "approval_not_found": (404, "not_found_error"),
    "file_not_found": (404, "not_found_error"),
    "method_not_allowed": (405, "invalid_request_error"),
    "evidence_in_use": (409, "invalid_request_error"),
    "approval_resolved": (409, "invalid_request_error"),
    "request_timeout": (408, "invalid_request_error"),
    "body_too_large": (413, "invalid_request_error"),
    "unsupported_media_type": (415, "invalid_request_error"),
    "headers_too_large": (431, "invalid_request_error"),
    "rate_limited": (429, "rate_limit_error"),
    "queue_full": (429, "rate_limit_error"),
    "admission_timeout": (429, "rate_limit_error"),
    "budget_exhausted": (429, "rate_limit_error"),
    "concurrency_limited": (429, "rate_limit_error"),
    "internal_error": (500, "server_error"),
    "storage_error": (500, "server_error"),
    "upstream_unavailable": (502, "upstream_unavailable"),
    "upstream_protocol_error": (502, "upstream_protocol_error"),
    "upstream_error": (502, "upstream_error"),
    "upstream_not_ready": (503, "upstream_not_ready"),
    "audit_unavailable": (503, "server_error"),
    "limits_unavailable": (503, "server_error"),
    "state_unavailable": (503, "server_error"),
    "upstream_timeout": (504, "upstream_timeout"),
    "agent_run_timeout": (504, "server_error"),
    "http_version_not_supported": (505, "invalid_request_error"),
}

#: receipt outcome implied by an error code when the raiser names none
_DEFAULT_OUTCOME: dict[ErrorCode, str] = {
    "upstream_protocol_error": "protocol_error",
    "upstream_error": "upstream_error",
    "upstream_rejected": "upstream_error",
    "upstream_timeout": "incomplete",
    "upstream_unavailable": "incomplete",
    # spec §24: max_run_s ends the run; the receipt says the worker ran out of time
    "agent_run_timeout": "upstream_timeout",
}

_DEFAULT_MESSAGES: dict[ErrorCode, str] = {
    "missing_credentials": "A bearer credential is required.",
    "invalid_token": "The credential is not valid.",
    "tenant_not_configured": "The credential's tenant is not configured on this gateway.",
    "insufficient_scope": "The credential lacks the scope this endpoint needs.",
    "endpoint_not_allowed": "This endpoint is not allowed for the tenant.",
    "model_not_found": "The model does not exist or is not available to this tenant.",
    "evidence_not_found": "No such evidence.",
    "not_found": "No such route.",
    "method_not_allowed": "Method not allowed on this route.",
    "body_too_large": "The request body is too large.",
    "invalid_json": "The request body is not valid JSON.",
    "upstream_not_ready": "The inference worker is not ready.",
    "upstream_unavailable": "The inference worker is unavailable.",
    "upstream_timeout": "The inference worker timed out.",
    "upstream_error": "The inference worker reported an error.",
    "upstream_protocol_error": "The inference worker broke the stream protocol.",
    "upstream_rejected": "The inference worker rejected the request.",
    "internal_error": "Internal gateway error.",
    "request_timeout": "The request did not arrive in time.",
    "headers_too_large": "The request headers are too large.",
    "http_version_not_supported": "Only HTTP/1.1 is served.",
    "storage_error": "The evidence store failed.",
    "issuer_not_allowed": "The credential's issuer is not allowed for this tenant.",
    "evidence_quota_exceeded": "The tenant's evidence quota is exhausted.",
    "response_not_found": "No such response.",
    "audit_unavailable": "Receipts cannot be written right now; try again later.",
    "limits_unavailable": "Rate limits cannot be checked right now; try again later.",
    "state_unavailable": "The shared state store is unavailable right now; try again later.",
    "tool_not_allowed": "The tenant may not have the worker run this tool.",
    "approval_requires_events": (
        "Approval by the caller needs a stream with agent events (x-agent-events: 1)."
    ),
    "approval_not_found": "No such pending approval.",
    "approval_resolved": "The approval was already decided.",
    "file_not_found": "No such file.",
    "agent_run_timeout": "The agent run exceeded its time limit.",
    "model_not_capable": "The model cannot serve this request.",
}


#: HTTP status -> Anthropic error type (spec §19); other 4xx are invalid requests
_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


def anthropic_type(status: int) -> str:
    if status >= 500:
        return "api_error"
    return _ANTHROPIC_TYPES.get(status, "invalid_request_error")


class GatewayError(Exception):
    """A refusal with a contract code; see the module docstring."""

    def __init__(
        self,
        code: ErrorCode,
        message: str | None = None,
        *,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
        outcome: str | None = None,
    ) -> None:
        if code not in _CODES:  # a code built at run time (mypy checks the literal ones)
            raise ValueError(f"unknown error code {code!r}")
        self.code: ErrorCode = code
        self.message = message or _DEFAULT_MESSAGES.get(code, code.replace("_", " "))
        self.param = param
        self.headers: dict[str, str] = dict(headers or {})
        self.outcome = outcome or _DEFAULT_OUTCOME.get(code, "rejected")
        super().__init__(f"{code}: {self.message}")

    @property
    def status(self) -> int:
        return _CODES[self.code][0]

    @property
    def type(self) -> str:
        return _CODES[self.code][1]

    def body(self) -> dict[str, Any]:
        """The OpenAI-shaped body, for JSON responses and SSE error events."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "code": self.code,
                "param": self.param,
            }
        }

    def anthropic_body(self) -> dict[str, Any]:
        """The Anthropic-shaped body (spec §19): the same code and status, the
        Anthropic SDKs' error type for the status."""
        return {
            "type": "error",
            "error": {
                "type": anthropic_type(self.status),
                "message": self.message,
                "code": self.code,
                "param": self.param,
            },
        }

    def response_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.status == 401:
            headers.setdefault("www-authenticate", "Bearer")
        return headers


def is_error_code(value: str) -> bool:
    return value in _CODES


assert set(get_args(ErrorCode)) == set(_CODES), "every code has a status, and only those"
