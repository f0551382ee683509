"""A form a tool asks a person to fill in (an MCP server's elicitation): its JSON Schema, the
defaults it starts from (SEP-1034) and the check of an answer.

MCP restricts a requested schema to a flat object whose properties are strings, numbers,
integers, booleans and enums (a string with ``enum``, or ``oneOf`` of titled ``const``s). The
check itself is JSON Schema's (``jsonschema``, which the ``mcp`` extra brings), so what the
server would accept is what passes here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

__all__ = ["FormField", "form_defaults", "check_form_schema", "check_form_answer", "form_fields", "parse_field"]

#: the property types a form may ask for
KINDS = ("string", "number", "integer", "boolean")


@dataclass(frozen=True)
class FormField:
    """One property of a form, as a widget needs it: ``kind`` is ``string``, ``number``,
    ``integer``, ``boolean`` or ``enum`` (``options``: the values, ``labels``: what to show)."""

    name: str
    kind: str
    title: str
    description: str = ""
    required: bool = False
    default: Any = None
    options: tuple[Any, ...] = ()
    labels: tuple[str, ...] = ()


def form_defaults(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema's default values, by property (what a form shows before the person types)."""
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(props, Mapping):
        return {}
    return {k: p["default"] for k, p in props.items() if isinstance(p, Mapping) and "default" in p}


def check_form_schema(schema: Any) -> None:
    """Raise ValueError (why) unless ``schema`` is valid JSON Schema for an object."""
    if not isinstance(schema, Mapping):
        raise ValueError(f"the requested schema is not an object (it is {type(schema).__name__})")
    from jsonschema import validators
    from jsonschema.exceptions import SchemaError

    cls = validators.validator_for(dict(schema))
    try:
        cls.check_schema(dict(schema))
    except SchemaError as e:
        raise ValueError(f"the server's requested schema is not valid JSON Schema ({e.message})") from None
    props = schema.get("properties", {})
    if schema.get("type", "object") != "object" or not isinstance(props, Mapping):
        raise ValueError("the requested schema is not an object with properties")


def check_form_answer(schema: Mapping[str, Any], content: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """``content`` with the defaults applied, once it matches the schema (else ValueError why)."""
    if content is not None and not isinstance(content, Mapping):
        raise ValueError(f"the answer must be an object (a dict of the form's fields), not {type(content).__name__}")
    merged = {**form_defaults(schema), **dict(content or {})}
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    order = [k for k in props if k in merged] if isinstance(props, Mapping) else []
    filled = {**{k: merged[k] for k in order}, **merged}  # (the schema's order, then anything else)
    check_form_schema(schema)
    from jsonschema import validators
    from jsonschema.exceptions import best_match

    cls = validators.validator_for(dict(schema))
    err = best_match(cls(dict(schema)).iter_errors(filled))
    if err is not None:
        where = "/".join(str(p) for p in err.absolute_path)
        raise ValueError(f"the answer does not match the requested schema{' at ' + repr(where) if where else ''}: "
                         f"{err.message}")
    return filled


def form_fields(schema: Mapping[str, Any]) -> list[FormField]:
    """The form's fields in the schema's order (a property of another type is shown as a string)."""
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(props, Mapping):
        return []
    required = set(schema.get("required") or ())
    out = []
    for name, p in props.items():
        p = p if isinstance(p, Mapping) else {}
        kind = p.get("type") if p.get("type") in KINDS else "string"
        options: tuple[Any, ...] = ()
        labels: tuple[str, ...] = ()
        if isinstance(p.get("enum"), list):
            options = tuple(p["enum"])
            names = p.get("enumNames")
            labels = tuple(str(n) for n in names) if isinstance(names, list) and len(names) == len(options) \
                else tuple(str(o) for o in options)
        elif isinstance(one_of := p.get("oneOf") or p.get("anyOf"), list):
            choices = [c for c in one_of if isinstance(c, Mapping) and "const" in c]
            options = tuple(c["const"] for c in choices)
            labels = tuple(str(c.get("title", c["const"])) for c in choices)
        out.append(FormField(name=str(name), kind="enum" if options else str(kind), title=str(p.get("title") or name),
                             description=str(p.get("description") or ""), required=name in required,
                             default=p.get("default"), options=options, labels=labels))
    return out


def parse_field(field: FormField, text: str) -> Any:
    """A value typed into a text box as the field's type (ValueError: it is not one); an empty
    box is None (left out of the answer, so the default or 'required' applies)."""
    text = text.strip()
    if text == "":
        return None
    if field.kind == "integer":
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{field.title}: {text!r} is not a whole number") from None
    if field.kind == "number":
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{field.title}: {text!r} is not a number") from None
    if field.kind == "boolean":
        if text.lower() in ("true", "yes", "1"):
            return True
        if text.lower() in ("false", "no", "0"):
            return False
        raise ValueError(f"{field.title}: {text!r} is not true or false")
    return text
