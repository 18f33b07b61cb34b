"""``/openapi.json`` for the store service: FastAPI's schema of its own routes, plus the ``/v1``
store endpoints described from the same table that serves them (:mod:`agentgrad.store.service.routes`).

The store endpoints are not FastAPI routes (see :mod:`agentgrad.store.service.api`), so their operations
and the JSON schemas of their wire models are built here, once, on the first request for the
schema.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from agentgrad.store import wire
from agentgrad.store.service.routes import Endpoint

_REF = "#/components/schemas/{model}"
_Mode = Literal["validation", "serialization"]

#: The error answers every store endpoint may give, all with an ErrorBody.
ERROR_DOCS: dict[int | str, dict[str, Any]] = {
    code: {"description": why, "content": {"application/json": {"schema": {"$ref": _REF.format(model="ErrorBody")}}}}
    for code, why in (
        (400, "refused input"),
        (401, "missing or wrong bearer token"),
        (404, "unknown id"),
        (409, "forbidden transition or id already taken"),
        (413, "body too large"),
        (422, "request does not match the schema"),
    )
}


def document(app: FastAPI, endpoints: Sequence[Endpoint]) -> None:
    """Make ``app.openapi()`` describe ``endpoints`` and ErrorBody besides FastAPI's own routes."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            models = _models(endpoints)
            refs, defs = models_json_schema(models, ref_template=_REF)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
            for endpoint in endpoints:
                schema["paths"].setdefault(endpoint.path, {})[endpoint.method.lower()] = _operation(endpoint, refs)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _models(endpoints: Sequence[Endpoint]) -> list[tuple[type[BaseModel], _Mode]]:
    wanted: dict[tuple[type[BaseModel], _Mode], None] = {(wire.ErrorBody, "serialization"): None}
    for endpoint in endpoints:
        if endpoint.body is not None:
            wanted[(endpoint.body, "validation")] = None
        if endpoint.response is not None:
            wanted[(endpoint.response, "serialization")] = None
    return list(wanted)


def _operation(endpoint: Endpoint, refs: Mapping[tuple[Any, _Mode], Any]) -> dict[str, Any]:
    doc = inspect.getdoc(endpoint.call) or ""
    operation: dict[str, Any] = {
        "tags": [endpoint.tag],
        "summary": endpoint.call.__name__.replace("_", " ").capitalize(),
        "description": doc,
        "operationId": endpoint.call.__name__,
    }
    if endpoint.query is not None:
        operation["parameters"] = _parameters(endpoint.query)
    if endpoint.body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": refs[(endpoint.body, "validation")]}},
        }
    ok: dict[str, dict[str, Any]]
    if endpoint.response is None:
        ok = {"204": {"description": "Done"}}
    else:
        ok = {
            "200": {
                "description": "Successful Response",
                "content": {"application/json": {"schema": refs[(endpoint.response, "serialization")]}},
            }
        }
    operation["responses"] = {**ok, **{str(code): doc for code, doc in ERROR_DOCS.items()}}
    return operation


def _parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    schema = model.model_json_schema(ref_template=_REF)
    required = set(schema.get("required", ()))
    parameters = []
    for name, prop in schema["properties"].items():
        parameter: dict[str, Any] = {"name": name, "in": "query", "required": name in required, "schema": prop}
        if "description" in prop:
            parameter["description"] = prop["description"]
        parameters.append(parameter)
    return parameters
