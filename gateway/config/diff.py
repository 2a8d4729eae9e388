"""Which keys differ between two typed configs, as dotted paths (never values).

For the SIGHUP warning: a reload applies policies and key files only, so an
operator who edited ``gateway.yaml`` is told exactly which keys wait for a
restart. The two models are compared field by field: nested models and
lists of models are walked (``auth.issuers[1].leeway_s``); a list whose
length changed, a section that appeared or went away, or any other value
that differs is reported at its own path. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from pydantic import BaseModel


def changed_keys(old: BaseModel, new: BaseModel) -> list[str]:
    """Dotted paths of every leaf that differs, in field order."""
    return list(_diff(old, new, ""))


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _diff(old: object, new: object, path: str) -> Iterator[str]:
    if old == new:
        return
    if isinstance(old, BaseModel) and isinstance(new, BaseModel) and type(old) is type(new):
        for name in type(old).model_fields:
            yield from _diff(getattr(old, name), getattr(new, name), _join(path, name))
        return
    if isinstance(old, list | tuple) and isinstance(new, list | tuple) and len(old) == len(new):
        for index, (a, b) in enumerate(zip(old, new, strict=True)):
            yield from _diff(a, b, f"{path}[{index}]")
        return
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for key in [*old, *(k for k in new if k not in old)]:
            yield from _diff(old.get(key), new.get(key), _join(path, str(key)))
        return
    yield path or "(top level)"
