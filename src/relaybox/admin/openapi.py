"""The OpenAPI 3.1 document of the admin API, generated from the registered
operations and their pydantic models (the same declarations that serve requests).

It is committed as ``docs/admin-openapi.json`` so clients and reviewers see the
contract change in a diff; a test fails when the committed copy is stale. Regenerate:

    python -m relaybox.admin.openapi --write docs/admin-openapi.json
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from relaybox.admin.sections import Operation, Section
from relaybox.ops.inbound_models import ErrorBody
from relaybox.outbound.openapi import document_command, document_text

__all__ = ["REGENERATE", "main", "openapi_document", "render"]

REGENERATE = "python -m relaybox.admin.openapi --write docs/admin-openapi.json"

_REF = "#/components/schemas/{model}"
_ERROR_TEXT = {
    400: "Invalid request (query, path or body)",
    401: "No or wrong bearer token",
    404: "No such row, or the section's tables are not migrated",
    409: "The row is not in the state this action needs",
    413: "The request body is over admin.api_max_body bytes",
    422: "Well-formed, but refused: the message names the place and the problem",
    503: "No key to seal secrets with (outbound.secrets_key)",
}


def openapi_document(sections: Sequence[Section] | None = None) -> dict[str, Any]:
    """The document for ``sections`` (default: every registered section)."""
    if sections is None:
        from relaybox.admin import registered_sections

        sections = registered_sections()
    ops = [(s, op) for s in sections for op in s.operations]
    models: list[tuple[type[BaseModel], Any]] = [(ErrorBody, "serialization")]
    for _, op in ops:
        models.append((op.response, "serialization"))
        if op.body is not None:
            models.append((op.body, "validation"))
        if op.query is not None:
            models.append((op.query, "validation"))
    unique = list(dict.fromkeys(models))
    keys, top = models_json_schema(unique, ref_template=_REF)
    schemas: dict[str, Any] = top.get("$defs", {})

    def ref(model: type[BaseModel], mode: str) -> dict[str, Any]:
        return keys[(model, mode)]  # type: ignore[index]

    paths: dict[str, dict[str, Any]] = {}
    for section, op in ops:
        item = paths.setdefault(op.openapi_path, {})
        item[op.method.lower()] = _operation(section, op, ref, schemas)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "relaybox admin API",
            "version": "1",
            "description": "Operator API of relaybox: inbox events, replay, dead letters, "
            "quarantine, stats and the outbound side. Every route needs "
            "`Authorization: Bearer <admin_token>`. Times are epoch seconds.",
        },
        "servers": [{"url": "/admin/api/v1"}],
        "security": [{"bearer": []}],
        "tags": [
            {"name": s.name, "description": s.tag_description or s.title}
            for s in sections
            if s.operations
        ],
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": dict(sorted(schemas.items())),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _operation(section: Section, op: Operation, ref: Any, schemas: dict[str, Any]) -> Any:
    out: dict[str, Any] = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "tags": [section.name],
    }
    if op.description:
        out["description"] = op.description
    if section.requires_tables:
        out["x-requires-tables"] = list(section.requires_tables)
    kinds = {"int": {"type": "integer"}, "str": {"type": "string"}}
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "schema": kinds[kind]}
        for name, kind in op.path_params
    ]
    if op.query is not None:
        target = ref(op.query, "validation")["$ref"].rsplit("/", 1)[1]
        schema = schemas[target]
        required = set(schema.get("required", []))
        for name, prop in schema["properties"].items():
            prop = dict(prop)
            description = prop.pop("description", None)
            prop.pop("title", None)
            param = {"name": name, "in": "query", "required": name in required, "schema": prop}
            if description:
                param["description"] = description
            params.append(param)
    if params:
        out["parameters"] = params
    if op.body is not None:
        out["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": ref(op.body, "validation")}},
        }
    responses: dict[str, Any] = {
        str(op.status): {
            "description": "OK",
            "content": {"application/json": {"schema": ref(op.response, "serialization")}},
        }
    }
    errors = {401, *op.errors}
    if op.query is not None or op.body is not None:
        errors.add(400)
    if op.body is not None:
        errors.add(413)
    if op.path_params or section.requires_tables:
        errors.add(404)
    error_ref = ref(ErrorBody, "serialization")
    for status in sorted(errors):
        responses[str(status)] = {
            "description": _ERROR_TEXT[status],
            "content": {"application/json": {"schema": error_ref}},
        }
    out["responses"] = responses
    return out


def render(document: dict[str, Any] | None = None) -> str:
    """This document (or ``document``) as stable text (:func:`document_text`)."""
    return document_text(document or openapi_document())


def main(argv: Sequence[str] | None = None) -> int:
    return document_command(render, "admin", argv)


if __name__ == "__main__":
    raise SystemExit(main())
