"""Field allowlists as small composable specs: every level of a request body.

A *spec* is a function ``(value, path) -> value``: it returns what may be
forwarded (possibly a cleaned copy) or :data:`DROP` (accepted, not
forwarded), and raises a :class:`~gateway.core.errors.GatewayError` naming the
offending field in ``param`` as a path (``messages[1].foo``,
``tools[0].function.name``). Objects are allowlisted at every depth (spec
§13 "Nested objects"); numbers are type-checked strictly (JSON ``true`` is
not ``1`` and ``1.0`` is not an integer). Pure: no I/O.

Unknown names are ``unsupported_field``; wrong types and values are
``invalid_request``. A field name goes into ``param`` only when it looks like
an identifier, so an error never echoes arbitrary caller text.

An explicit JSON ``null`` on an optional field is the field's absence (spec
§24, as OpenAI takes it: SDKs and frameworks send ``null`` for what they leave
unset): :func:`obj` leaves it out of what it forwards, unless the object
names the field in ``keep_null`` (a null the worker must see: an assistant
turn's ``content`` beside its tool calls). A null on a required field is still
refused by the field's spec, and a null under a refused name is no request for
what that name would ask, so it is absent too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from gateway.core.errors import GatewayError

Spec = Callable[[Any, str], Any]


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


#: returned by a spec for a field that is accepted but not forwarded
DROP: Final = _Drop()

_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")


def child(path: str, name: str) -> str:
    shown = name if _NAME.fullmatch(name) else "<field>"
    return f"{path}.{shown}" if path else shown


def item(path: str, index: int) -> str:
    return f"{path}[{index}]"


def invalid(path: str, what: str) -> GatewayError:
    where = path or "The request body"
    return GatewayError("invalid_request", f"{where} {what}.", param=path or None)


def unsupported(path: str, why: str = "is not supported here") -> GatewayError:
    return GatewayError("unsupported_field", f"Field {path} {why}.", param=path)


def any_json(value: Any, path: str) -> Any:
    """Any JSON value (schemas, tool parameters); depth is bounded by the body guard."""
    return value


def string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise invalid(path, "must be a string")
    return value


def boolean(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise invalid(path, "must be a boolean")
    return value


def integer(*, ge: int | None = None, le: int | None = None) -> Spec:
    def check(value: Any, path: str) -> int:
        if type(value) is not int:  # bool is an int subclass; 1.0 is a float
            raise invalid(path, "must be an integer")
        if (ge is not None and value < ge) or (le is not None and value > le):
            raise invalid(path, "is out of range")
        return value

    return check


def number(*, ge: float | None = None, le: float | None = None) -> Spec:
    def check(value: Any, path: str) -> float | int:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise invalid(path, "must be a number")
        if isinstance(value, float) and not math.isfinite(value):
            raise invalid(path, "must be finite")
        if (ge is not None and value < ge) or (le is not None and value > le):
            raise invalid(path, "is out of range")
        return value

    return check


def enum(*values: str) -> Spec:
    allowed = frozenset(values)

    def check(value: Any, path: str) -> str:
        if not isinstance(value, str) or value not in allowed:
            raise invalid(path, "has a value that is not supported")
        return value

    return check


def list_of(spec: Spec, *, min_items: int = 0, max_items: int | None = None) -> Spec:
    def check(value: Any, path: str) -> list[Any]:
        if not isinstance(value, list):
            raise invalid(path, "must be an array")
        if len(value) < min_items or (max_items is not None and len(value) > max_items):
            raise invalid(path, "has an unsupported number of entries")
        out = []
        for i, entry in enumerate(value):
            checked = spec(entry, item(path, i))
            if checked is not DROP:
                out.append(checked)
        return out

    return check


def string_or_strings(*, max_items: int | None = None) -> Spec:
    strings = list_of(string, max_items=max_items)

    def check(value: Any, path: str) -> str | list[str]:
        if isinstance(value, str):
            return value
        result: list[str] = strings(value, path)
        return result

    return check


def map_of(key: Callable[[str], bool], spec: Spec) -> Spec:
    """A JSON object with free keys (e.g. ``logit_bias``: token id -> bias)."""

    def check(value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise invalid(path, "must be an object")
        out = {}
        for name, entry in value.items():
            if not key(name):
                raise invalid(path, "has a key that is not supported")
            out[name] = spec(entry, path)
        return out

    return check


def harmless(value: Any, path: str) -> Any:
    """Changes nothing for the worker: accepted and dropped (spec §14)."""
    return DROP


def null_only(value: Any, path: str) -> Any:
    """Accepted and dropped when null (re-sent SDK messages); refused otherwise."""
    if value is not None:
        raise unsupported(path)
    return DROP


def obj(
    fields: Mapping[str, Spec],
    *,
    required: Iterable[str] = (),
    refused: Mapping[str, str] | None = None,
    keep_null: Iterable[str] = (),
) -> Spec:
    """An object whose every key is allowlisted; ``refused`` names the keys
    refused with a reason (agentic and server-side tool fields, spec §12).
    A ``null`` on a field that is not required is its absence, except for the
    names in ``keep_null`` (module docstring)."""
    must = tuple(required)
    refusals = dict(refused or {})
    # a null passed to the field's spec: required (refused there) or kept
    checked_nulls = frozenset(must) | frozenset(keep_null)

    def check(value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise invalid(path, "must be an object")
        out: dict[str, Any] = {}
        for name, entry in value.items():
            if entry is None and name not in checked_nulls and isinstance(name, str):
                continue
            where = child(path, name) if isinstance(name, str) else child(path, "")
            reason = refusals.get(name)
            if reason is not None:
                raise unsupported(where, reason)
            spec = fields.get(name)
            if spec is None:
                raise unsupported(where)
            checked = spec(entry, where)
            if checked is not DROP:
                out[name] = checked
        for name in must:
            if name not in value:
                raise invalid(child(path, name), "is required")
        return out

    return check


def token_id(name: str) -> bool:
    return name.isdigit() and len(name) <= 10


def json_size(value: Any) -> int:
    """Bytes the worker reads for a structured value (tool definitions, schemas):
    its strings' UTF-8 plus names and a little per scalar. Iterative."""
    size = 0
    stack = [value]
    while stack:
        current = stack.pop()
        if isinstance(current, str):
            size += len(current.encode("utf-8", "surrogatepass"))
        elif isinstance(current, dict):
            for key, entry in current.items():
                size += len(str(key)) + 3
                stack.append(entry)
        elif isinstance(current, list):
            size += 1
            stack.extend(current)
        else:
            size += 8
    return size


def text_size(value: str) -> int:
    return len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
