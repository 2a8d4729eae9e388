"""Dialects, one folder per API: descriptor, request planning, stream grammar, answer. Pure.

``chat/`` (chat and legacy completions: ``api``, ``completions``, the chunk
``grammar``, ``dialect``, ``answer``), ``responses/`` (``api``, ``events``,
``fill``, ``conversation``), ``messages/`` (``api``, ``events``,
``to_chat``: Anthropic Messages forwarded as chat), ``embeddings/`` (``api``,
``scan``), ``images/`` (``api``, ``answer``, ``png``: n worker calls, one
answer) and ``speech/`` (``api``, ``audio``: a binary body checked whole). A
new API is a new folder. ``base.py`` says what a descriptor is (its :class:`Endpoint`,
planning, the forwarded body, the dialect); ``media``, ``fields``,
``sampling`` and ``usage`` are the pieces they share. The pipeline
(``gateway/pipeline``) serves every entry of :data:`APIS` the same way.

Layer: may import ``config``, ``observe``, ``core`` and ``types``; no I/O library.
"""

from gateway.apis.base import Api
from gateway.apis.chat.api import ChatApi
from gateway.apis.chat.completions import CompletionsApi
from gateway.apis.embeddings.api import EmbeddingsApi
from gateway.apis.images.api import ImagesApi
from gateway.apis.messages.api import CountTokensApi, MessagesApi
from gateway.apis.responses.api import ResponsesApi
from gateway.apis.speech.api import SpeechApi

APIS: tuple[Api, ...] = (
    ChatApi(),
    CompletionsApi(),
    ResponsesApi(),
    EmbeddingsApi(),
    MessagesApi(),
    CountTokensApi(),
    ImagesApi(),
    SpeechApi(),
)

__all__ = ["APIS", "Api"]
