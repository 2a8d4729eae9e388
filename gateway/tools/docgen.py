"""The config and policy reference, generated from the pydantic models.

``mistralrs-gateway schema config|policy`` prints a model's JSON Schema;
``python -m gateway.tools.docgen > docs/reference.md`` renders both schemas as
Markdown: every key with its type, default and description (from
``Field(description=...)``, or the section model's docstring). Nothing here
knows a key by name, so a field added to a model shows up on the next
regeneration; ``tests/tools/test_docgen.py`` fails while the file and the models
disagree.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from gateway.config import GatewayConfig
from gateway.config.policy import TenantPolicy

#: verb argument -> (model, the file it describes)
SCHEMAS: Mapping[str, tuple[type[BaseModel], str]] = {
    "config": (GatewayConfig, "gateway.yaml"),
    "policy": (TenantPolicy, "policies/<tenant>.yaml"),
}

Schema = dict[str, Any]


def json_schema(name: str) -> Schema:
    model, _ = SCHEMAS[name]
    return model.model_json_schema()


@dataclass
class _Section:
    model: str
    paths: list[str] = field(default_factory=list)


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _nested(prop: Schema) -> tuple[str, str] | None:
    """(model name, path suffix) when a property holds a model, a list of them or a map."""
    if "$ref" in prop:
        return _ref_name(prop["$ref"]), ""
    for option in prop.get("anyOf", []):
        found = _nested(option)
        if found is not None:
            return found
    if prop.get("type") == "array" and isinstance(prop.get("items"), dict):
        found = _nested(prop["items"])
        if found is not None:
            return found[0], "[]" + found[1]
    extra = prop.get("additionalProperties")
    if prop.get("type") == "object" and isinstance(extra, dict):
        found = _nested(extra)
        if found is not None:
            return found[0], ".<name>" + found[1]
    return None


def _bounds(prop: Schema) -> list[str]:
    words = []
    for key, sign in (
        ("exclusiveMinimum", ">"),
        ("minimum", ">="),
        ("exclusiveMaximum", "<"),
        ("maximum", "<="),
    ):
        if key in prop:
            words.append(f"{sign} {prop[key]}")
    if "minLength" in prop:
        words.append(f"length >= {prop['minLength']}")
    if "maxLength" in prop:
        words.append(f"length <= {prop['maxLength']}")
    if "minItems" in prop:
        words.append(f"items >= {prop['minItems']}")
    if "pattern" in prop:
        words.append(f"matching `{prop['pattern']}`")
    return words


def _type(prop: Schema) -> str:
    if "$ref" in prop:
        return f"`{_ref_name(prop['$ref'])}`"
    if "anyOf" in prop:
        return " or ".join(_type(option) for option in prop["anyOf"])
    if "enum" in prop:
        return " or ".join(f"`{json.dumps(v)}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    kind = prop.get("type", "any")
    if kind == "array":
        text = f"list of {_type(prop.get('items', {}))}"
    elif kind == "object":
        extra = prop.get("additionalProperties")
        text = f"map of string to {_type(extra)}" if isinstance(extra, dict) else "object"
    elif kind == "string" and prop.get("format") == "path":
        text = "path"
    else:
        text = str(kind)
    bounds = _bounds(prop)
    return f"{text} ({', '.join(bounds)})" if bounds else text


def _default(prop: Schema, required: bool) -> str:
    if required:
        return "required"
    if "default" not in prop:
        return ""
    value = prop["default"]
    if isinstance(value, dict) and value and _nested(prop) is not None:
        return "its section's defaults"
    return f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").strip()


def _sections(root: str, schema: Schema, defs: Schema) -> list[_Section]:
    """Every model reachable from the root, with every path it sits at, in first-seen order."""
    sections = {root: _Section(root, [""])}
    order = [sections[root]]

    def children(section: _Section) -> list[tuple[str, str, str]]:
        """(child model, field name, path suffix) of each nested model field."""
        model = defs.get(section.model, schema) if section.model != root else schema
        found = []
        for name, prop in model.get("properties", {}).items():
            nested = _nested(prop)
            if nested is not None:
                found.append((nested[0], name, nested[1]))
        return found

    index = 0
    while index < len(order):  # the models, breadth first
        for child, _, _ in children(order[index]):
            if child not in sections:
                sections[child] = _Section(child)
                order.append(sections[child])
        index += 1
    # Then the paths, to a fixpoint: a model met again deeper down gains paths
    # its children must get too (bounded: paths only grow along the finite graph).
    for _ in range(len(order) + 1):
        grew = False
        for section in order:
            for child, name, suffix in children(section):
                for path in section.paths:
                    key = (f"{path}.{name}" if path else name) + suffix
                    if key not in sections[child].paths:
                        sections[child].paths.append(key)
                        grew = True
        if not grew:
            break
    return order


def _render_model(section: _Section, model: Schema, defs: Schema, heading: str) -> list[str]:
    lines = [heading, ""]
    if model.get("description"):
        lines += [" ".join(model["description"].split()), ""]
    lines += ["| key | type | default | description |", "|---|---|---|---|"]
    required = set(model.get("required", []))
    prefix = section.paths[0]
    for name, prop in model.get("properties", {}).items():
        key = f"{prefix}.{name}" if prefix else name
        description = prop.get("description", "")
        nested = _nested(prop)
        if nested is not None and not description:
            description = defs.get(nested[0], {}).get("description", "")
        cells = [f"`{key}`", _type(prop), _default(prop, name in required), description]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return [*lines, ""]


def render_schema(name: str) -> list[str]:
    model, file = SCHEMAS[name]
    schema = json_schema(name)
    defs: Schema = schema.get("$defs", {})
    root = model.__name__
    lines = [f"## `{file}` ({root})", ""]
    for section in _sections(root, schema, defs):
        if section.model == root:
            heading = f"### top level ({root})"
            body = schema
        else:
            heading = f"### {', '.join(f'`{p}`' for p in section.paths)} ({section.model})"
            body = defs[section.model]
        lines += _render_model(section, body, defs, heading)
    return lines


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from the pydantic models (`gateway/config/`, `gateway/config/policy.py`) by",
        "`python -m gateway.tools.docgen > docs/reference.md`; do not edit it by hand",
        "(`tests/tools/test_docgen.py` fails while it and the models disagree). The same",
        "models as JSON Schema: `mistralrs-gateway schema config` and",
        "`mistralrs-gateway schema policy`.",
        "",
        "Every model refuses unknown keys. Relative paths resolve against the folder of",
        "the file that names them. `required` keys have no default; a section's",
        "default is the defaults of its keys.",
        "",
    ]
    for name in SCHEMAS:
        lines += render_schema(name)
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
