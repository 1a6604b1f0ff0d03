"""Validate bodies against the component schemas of OpenAI's published OpenAPI document.

The document (``../shared/openai-openapi/openapi.yaml``) is OpenAPI 3.1, whose schemas are JSON
Schema 2020-12 except that some still carry OpenAPI 3.0's ``nullable: true``, which is honoured here;
``$ref``s resolve inside the document. As its SOURCE.md advises, ``null`` is allowed for optional
(non-required) properties, since the live API sends it; required fields are checked exactly.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC = Path(__file__).resolve().parents[3].parent / "shared" / "openai-openapi" / "openapi.yaml"
_URI = "urn:openai-openapi"


@functools.cache
def _registry() -> Registry:  # type: ignore[type-arg]
    with SPEC.open("rb") as f:
        doc = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - safe loader
    return Registry().with_resource(_URI, Resource.from_contents(doc, default_specification=DRAFT202012))


def _nullable(keyword: str) -> Any:
    original = jsonschema.Draft202012Validator.VALIDATORS[keyword]

    def check(validator: Any, value: Any, instance: Any, schema: dict[str, Any]) -> Any:
        if instance is None and schema.get("nullable") is True:
            return
        yield from original(validator, value, instance, schema)

    return check


def _properties(validator: Any, properties: dict[str, Any], instance: Any, schema: dict[str, Any]) -> Any:
    if not validator.is_type(instance, "object"):
        return
    required = set(schema.get("required", ()))
    for name, subschema in properties.items():
        if name in instance and not (instance[name] is None and name not in required):
            yield from validator.descend(instance[name], subschema, path=name, schema_path=name)


_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    {"type": _nullable("type"), "enum": _nullable("enum"), "properties": _properties},
)


def validate(component: str, body: Any) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``body`` matches ``#/components/schemas/<component>``."""
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": f"{_URI}#/components/schemas/{component}",
    }
    _Validator(schema, registry=_registry()).validate(body)
