"""Where a base was imported from: provenance kept beside it (names/origins/<base hex>), never
part of its identity (the base manifest holds no path, so the same weights imported from two
places are one base; the last import's origin is kept).

    {"hub_id": "org/name" | null, "path": "/abs/path/it/was/imported/from", "schema": SCHEMA}

`slm export --format peft` names it as the adapter's base_model_name_or_path (the Hub id when the
checkpoint recorded one, else the path).
"""

from __future__ import annotations

from pathlib import Path

from slm.errors import InvalidInput
from slm.formats.jsonfile import canonical_json, parse_json_object

SCHEMA = "slm.base-origin/1"
MAX_RECORD_BYTES = 64 << 10


def origin_record(path: Path, hub_id: str | None) -> bytes:
    return canonical_json({"hub_id": hub_id, "path": str(Path(path).resolve()), "schema": SCHEMA})


def parse_origin_record(data: bytes, what: str) -> dict:
    doc = parse_json_object(data, what, MAX_RECORD_BYTES)
    if (doc.get("schema") != SCHEMA or set(doc) != {"hub_id", "path", "schema"}
            or not isinstance(doc["path"], str) or not isinstance(doc["hub_id"], (str, type(None)))):
        raise InvalidInput(f"{what}: not a {SCHEMA} record")
    return doc
