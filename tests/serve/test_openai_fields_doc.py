"""docs/serve.md's table of request fields is complete and true to the server's allowlist:
every field the installed `openai` client can send to /v1/chat/completions or /v1/completions
is one slm implements, accepts without effect or refuses by name (none falls through to
"unknown field"), and every one of them is in the table (issue 31)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slm.server.protocol import FIELDS, IGNORED, UNSUPPORTED, BadRequest, check_fields

openai = pytest.importorskip("openai")
DOC = Path(__file__).resolve().parents[2] / "docs" / "serve.md"


def _client_fields() -> dict[str, set[str]]:
    from openai.types import completion_create_params as completions
    from openai.types.chat import completion_create_params as chat

    def fields(module) -> set[str]:
        return set(module.CompletionCreateParamsBase.__annotations__) | {"stream"}

    return {"chat": fields(chat), "completions": fields(completions)}


def _table_fields() -> dict[str, set[str]]:
    """Each row of the "Request fields" table: its fields (first column) by endpoint."""
    text = DOC.read_text()
    table = text[text.index("| field | endpoint | slm |"):].split("\n\n")[0]
    out: dict[str, set[str]] = {"chat": set(), "completions": set()}
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        names = set(re.findall(r"`([a-z_]+)`", cells[0]))
        for endpoint in (("chat", "completions") if cells[1] == "both" else (cells[1],)):
            out[endpoint] |= names
    return out


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_every_field_the_openai_client_sends_is_classified(endpoint):
    known = FIELDS[endpoint] | IGNORED | UNSUPPORTED | FIELDS["chat"]
    assert _client_fields()[endpoint] - known == set()


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_every_client_and_server_field_is_in_the_docs_table(endpoint):
    table = _table_fields()[endpoint]
    assert _client_fields()[endpoint] - table == set()
    assert (FIELDS[endpoint] | IGNORED) - table == set()
    assert UNSUPPORTED - (_table_fields()["chat"] | _table_fields()["completions"]) == set()


def test_the_tables_refused_fields_are_refused_by_name():
    """A field the table marks 400 gets "unsupported field: NAME"; an accepted one passes."""
    for name in ("moderation", "audio", "verbosity"):
        with pytest.raises(BadRequest, match=f"unsupported field: {name}"):
            check_fields({name: {"x": 1}}, chat=True)
    check_fields({"prompt_cache_retention": "24h", "prompt_cache_options": {"ttl": "1h"}}, chat=True)
