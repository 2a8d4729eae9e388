"""Endpoint descriptors: what differs between the inference endpoints.

Each module owns one endpoint's field allowlist and planning, the body it
forwards and its dialect (``base.py`` says what a descriptor is); ``media``,
``fields``, ``sampling`` and ``usage`` are the pieces they share. The
pipeline (``gateway/pipeline``) serves every entry of :data:`APIS` the
same way.
"""

from gateway.apis.base import Api
from gateway.apis.chat.api import ChatApi
from gateway.apis.chat.completions import CompletionsApi
from gateway.apis.embeddings.api import EmbeddingsApi
from gateway.apis.messages.api import CountTokensApi, MessagesApi
from gateway.apis.responses.api import ResponsesApi

APIS: tuple[Api, ...] = (
    ChatApi(),
    CompletionsApi(),
    ResponsesApi(),
    EmbeddingsApi(),
    MessagesApi(),
    CountTokensApi(),
)

__all__ = ["APIS", "Api"]
