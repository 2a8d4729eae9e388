"""The models one simulator serves (``mistralrs from-config`` with several
``[[models]]``), their ``/v1/models`` statuses, and how a request's ``model``
resolves to one of them. Pure data; ``State`` holds it under its lock.

Rules, as the real server's (findings §2, §8):

* The first route is the default model: ``"default"`` (or an omitted
  ``model``) resolves to it. Any other name must equal a route exactly.
* A route whose status is None is not listed and cannot be named; one that is
  ``unloaded`` is reloaded by the request that names it (the engine's blocking
  auto-reload); ``reloading`` is still served.
* ``/v1/models`` lists the synthetic ``default`` entry, then each listed route
  ``entries`` times (a duplicate is a misconfigured worker, for readiness tests).
* Each route has a kind, the worker's model category: ``chat`` (a text or
  multimodal model; it also answers embeddings, as every route did before
  kinds), ``embeddings``, ``image`` (``serve diffusion``) or ``speech``
  (``serve speech``). ``/v1/models`` looks the same for every kind (the
  worker's ``ModelObject`` has no category). A request a route's kind cannot
  serve gets the engine's ``Received a request incompatible for this model's
  category.`` (handlers.py answers it per endpoint).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.testing.simulator.knobs import MODEL_STATUSES, ROUTE_KINDS

INCOMPATIBLE = "Received a request incompatible for this model's category."
#: the endpoints each kind serves
_SERVES = {
    "chat": frozenset({"chat", "embeddings"}),
    "embeddings": frozenset({"embeddings"}),
    "image": frozenset({"image"}),
    "speech": frozenset({"speech"}),
}


@dataclass(slots=True)
class Route:
    model_id: str
    status: str | None = "loaded"
    entries: int = 1
    kind: str = "chat"

    def serves(self, endpoint: str) -> bool:
        """Whether this route's model answers ``endpoint`` (chat | embeddings | image | speech)."""
        return endpoint in _SERVES[self.kind]


class Routes:
    """The simulator's routes in configured order (the first is the default)."""

    def __init__(self, model_ids: Sequence[str | tuple[str, str]]) -> None:
        if not model_ids:
            raise ValueError("at least one model id is needed")
        pairs = [(m, "chat") if isinstance(m, str) else m for m in model_ids]
        ids = [m for m, _ in pairs]
        if len(set(ids)) != len(ids):
            raise ValueError("Model ID conflict: the model ids must be distinct")
        for model_id, kind in pairs:
            if not model_id or model_id == "default":
                raise ValueError(f"not a usable model id: {model_id!r}")
            if kind not in ROUTE_KINDS:
                raise ValueError(f"route kind must be one of {sorted(ROUTE_KINDS)}, not {kind!r}")
        self._routes = {m: Route(m, kind=kind) for m, kind in pairs}
        self.default = ids[0]

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(self._routes)

    def get(self, model_id: str) -> Route:
        route = self._routes.get(model_id)
        if route is None:
            raise ValueError(f"no such route: {model_id!r} (routes: {', '.join(self._routes)})")
        return route

    def set_status(self, model_id: str, status: str | None) -> None:
        if status is not None and status not in MODEL_STATUSES:
            raise ValueError(f"status must be one of {sorted(MODEL_STATUSES)} or None")
        self.get(model_id).status = status

    def set_entries(self, model_id: str, count: int) -> None:
        if not 0 <= count <= 16:
            raise ValueError("count must be 0..16")
        self.get(model_id).entries = count

    def reset(self) -> None:
        for route in self._routes.values():
            route.status, route.entries = "loaded", 1

    def listed(self) -> list[str]:
        return [r.model_id for r in self._routes.values() if r.status is not None]

    def resolve(self, name: str) -> Route | None:
        """The route a request's ``model`` names, loading it if unloaded; None if unknown."""
        route = self._routes.get(self.default if name == "default" else name)
        if route is None or route.status is None:
            return None
        if route.status == "unloaded":
            route.status = "loaded"  # mistral.rs reloads on demand inside the request
        return route

    def lookup(self, name: str) -> Route | None:
        """For the admin routes: the listed route ``name`` names (no reload)."""
        route = self._routes.get(self.default if name == "default" else name)
        return route if route is not None and route.status is not None else None

    def models_list(self, created: int) -> dict[str, Any]:
        data: list[dict[str, Any]] = [
            {"id": "default", "object": "model", "created": created, "owned_by": "local"}
        ]
        data[0]["root"] = "default"
        for route in self._routes.values():
            for _ in range(route.entries if route.status is not None else 0):
                data.append(
                    {
                        "id": route.model_id,
                        "object": "model",
                        "created": created,
                        "owned_by": "local",
                        "root": route.model_id,
                        "status": route.status,
                    }
                )
        return {"object": "list", "data": data}

    def unknown_model_message(self, name: str) -> str:
        return (
            f"Requested model '{name}' is not available. Available models: "
            f"{', '.join(self.listed())}. Use 'default' to use the default model."
        )
