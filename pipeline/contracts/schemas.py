"""JSON Schemas of the wire models, generated from the models themselves.

``python -m pipeline.contracts.schemas [DIR]`` writes them to ``schemas/`` (the default);
a test fails when a model and its published schema drift apart.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pipeline.contracts.models import (
    AUDIT_COLUMNS,
    SCHEMA_VERSION,
    AccountNotice,
    Alert,
    AuditRow,
    Decision,
    LoginAttempt,
)

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "schemas"

MODELS: dict[str, tuple[type[BaseModel], str]] = {
    "login_attempt.v1.json": (LoginAttempt, "validation"),
    "decision.v1.json": (Decision, "serialization"),
    "alert.v1.json": (Alert, "serialization"),
    "account_notice.v1.json": (AccountNotice, "serialization"),
    "audit_row.v1.json": (AuditRow, "serialization"),
}


def _audit_batch() -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "AuditBatch",
        "description": (
            "One message of the auth.audit topic: rows hold AuditRow's fields in the order "
            "of `columns`, with `ts_ms` (epoch milliseconds) in place of `ts`."
        ),
        "type": "object",
        "properties": {
            "v": {"const": SCHEMA_VERSION},
            "columns": {"const": list(AUDIT_COLUMNS)},
            "rows": {
                "type": "array",
                "items": {
                    "type": "array",
                    "minItems": len(AUDIT_COLUMNS),
                    "maxItems": len(AUDIT_COLUMNS),
                },
            },
        },
        "required": ["v", "columns", "rows"],
        "additionalProperties": False,
    }


def generate() -> dict[str, dict[str, Any]]:
    """File name -> schema document, for every published contract."""
    out: dict[str, dict[str, Any]] = {}
    for name, (model, mode) in MODELS.items():
        schema = model.model_json_schema(mode=mode)  # type: ignore[arg-type]
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["x-schema-version"] = SCHEMA_VERSION
        out[name] = schema
    out["audit_batch.v1.json"] = _audit_batch()
    return out


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write(directory: Path = SCHEMA_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in generate().items():
        path = directory / name
        path.write_text(render(schema), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else SCHEMA_DIR
    for path in write(target):
        print(path)
