"""A chat template is code that came with a file, and tokenizer data is what a run builds from:
both are checked when a base is imported, and a template is rendered bounded (in time, output
and memory) at every chat (slm.model.template_sandbox)."""

from __future__ import annotations

import pytest

from helpers import copy_store, one_line, refused, tiny_store
from hostile_fixtures import slm_proc
from template_fixtures import ATTACKS, TURNS, hostile_gguf, triggered

pytestmark = pytest.mark.hostile


@pytest.fixture(scope="module")
def template(tmp_path_factory, tiny_model):
    """A store with the tiny base `tq` and, for each attack, a base whose template runs it on
    the message "boom" (and renders a plain conversation otherwise)."""
    root = tmp_path_factory.mktemp("templates")
    files = {kind: hostile_gguf(root / f"{kind}.gguf", add_chat_template=triggered(attack))
             for kind, attack in ATTACKS.items()}
    steps = [("import", "base", path, "--name", kind) for kind, path in files.items()]
    return {"store": tiny_store(root, tiny_model, steps=(*steps, ("activate", "tq"))), "root": root}


@pytest.fixture
def store_dir(template, tmp_path):
    return copy_store(template["store"], tmp_path)


@pytest.mark.parametrize("kind", sorted(ATTACKS))
def test_a_template_that_exceeds_a_bound_is_refused_at_import(cli, store_dir, tmp_path, kind):
    path = hostile_gguf(tmp_path / "bad.gguf", add_chat_template=ATTACKS[kind])
    r = refused(cli, store_dir, 4, "import", "base", path, "--name", "bad")
    assert "chat template" in r.err


def test_a_template_that_renders_no_plain_conversation_is_refused_at_import(cli, store_dir, tmp_path):
    path = hostile_gguf(tmp_path / "never.gguf", add_chat_template="{{ raise_exception('never') }}")
    r = refused(cli, store_dir, 4, "import", "base", path, "--name", "never")
    assert "renders no plain conversation" in r.err and "never" in r.err


def test_a_template_that_refuses_a_system_message_imports(cli, store_dir, tmp_path):
    strict = "{% if messages[0].role == 'system' %}{{ raise_exception('no system message') }}{% endif %}" + TURNS
    path = hostile_gguf(tmp_path / "strict.gguf", add_chat_template=strict)
    assert cli("--store", store_dir, "import", "base", path, "--name", "strict").code == 0


@pytest.mark.parametrize("kind", sorted(ATTACKS))
def test_slm_run_chat_refuses_a_template_that_exceeds_a_bound(store_dir, kind):
    r = slm_proc(store_dir, "run", "--model", kind, "--chat", "-n", "2", "boom")
    err = r.stderr.decode()
    assert r.returncode == 4, err
    assert one_line(err) and "chat template" in err, err
    # the same base renders any other conversation: the refusal is that request's
    r = slm_proc(store_dir, "run", "--model", kind, "--chat", "-n", "2", "hello")
    assert r.returncode == 0, r.stderr.decode()


def test_a_chat_after_a_refused_render_renders_in_a_fresh_worker():
    from slm.errors import InvalidInput
    from slm.model.chat import render_chat
    from template_fixtures import HANG

    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(InvalidInput, match="took more than"):
        render_chat(triggered(HANG), [{"role": "user", "content": "boom"}], {})
    assert render_chat(TURNS, messages, {}) == "<|im_start|>user\nhi<|im_end|>\n"


@pytest.mark.parametrize("template_text, reason", [
    ("{{ 'x' | center(1000000000) }}", "memory"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursion"),
    ("{{ ('x' * 8000000) ~ ('y' * 8000000) }}", "output"),
    ("{{ 10 ** 100000000 }}", "power of more than"),
    ("{{ 1 / 0 }}", "ZeroDivisionError"),
])
def test_other_ways_to_exhaust_a_render_are_refused(template_text, reason):
    from slm.errors import InvalidInput
    from slm.model.chat import render_chat

    with pytest.raises(InvalidInput, match=reason):
        render_chat(template_text, [{"role": "user", "content": "hi"}], {})


def test_merges_naming_tokens_outside_the_vocabulary_are_refused_at_import(cli, store_dir, tmp_path):
    path = hostile_gguf(tmp_path / "merges.gguf", add_token_merges=["zzqq yyxx", "a b"])
    r = refused(cli, store_dir, 4, "import", "base", path, "--name", "bad")
    assert "tokenizer" in r.err and "zzqq" in r.err


def test_an_empty_token_list_is_refused():
    from slm.errors import InvalidInput
    from slm.formats.base_source import canonical_json
    from slm.model.tokenizer import check_tokenizer

    doc = {"format": 1, "source": "gguf", "fields": {"ggml.model": "gpt2", "ggml.tokens": [], "ggml.merges": []}}
    with pytest.raises(InvalidInput, match="no tokens"):
        check_tokenizer(canonical_json(doc))


def test_a_run_on_a_stored_tokenizer_that_builds_nothing_is_exit_4(cli, store_dir, tmp_path, monkeypatch):
    """A base stored before its tokenizer was checked at import: one line and exit 4, not an
    internal error."""
    from slm.ops.store import importing

    path = hostile_gguf(tmp_path / "merges.gguf", add_token_merges=["zzqq yyxx", "a b"])
    with monkeypatch.context() as m:
        m.setattr(importing, "check_tokenizer", lambda doc: None, raising=False)  # (absent before the check)
        assert cli("--store", store_dir, "import", "base", path, "--name", "old").code == 0
    r = refused(cli, store_dir, 4, "run", "--model", "old", "-n", "1", "hi")
    assert "tokenizer" in r.err and "internal" not in r.err
