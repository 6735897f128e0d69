"""The trained demo adapters (fixtures/demo_adapters) change SmolLM2's chat answers visibly
through slm, and switching them off gives back the base's exact output.

Greedy decoding on held-out questions (fixtures/demo_data/heldout.jsonl, in no training set).
No torch: the committed adapters, slm's CLI, the bundled SmolLM2-135M-Instruct Q4_1 GGUF.
Retrain the adapters with scripts/train_demo_adapters.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = [pytest.mark.real_model]

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS = ROOT / "fixtures" / "demo_adapters"
QUESTIONS = [json.loads(line)["prompt"]
             for line in (ROOT / "fixtures" / "demo_data" / "heldout.jsonl").read_text().splitlines()
             if line.strip()][:5]
SIGNATURE = "-- answered by slm"
BASE_TOKENS = 40  # the base answers are the reference for every adapter (one run per question)
STYLE_TOKENS = 20  # French and pirate show from the first words
SIGNATURE_TOKENS = 40  # short answer + signature line; generation usually stops at <|im_end|>

FRENCH_WORDS = {"le", "la", "les", "de", "des", "du", "est", "et", "un", "une", "pour", "vous",
                "je", "il", "pas", "que", "qui", "dans", "avec", "sont", "votre", "faire", "au"}
ENGLISH_WORDS = {"the", "is", "and", "you", "of", "to", "it", "that", "are", "with", "your",
                 "this", "what", "can", "for", "my", "i"}
PIRATE = re.compile(r"\b(arr+|matey|ye|yer|ahoy|hearty|savvy|landlubber|me hearties)\b", re.I)


def words(text: str) -> list[str]:
    return re.findall(r"[a-zà-öø-ÿœ]+", text.lower())


def is_french(text: str) -> bool:
    w = words(text)
    fr = sum(x in FRENCH_WORDS for x in w)
    en = sum(x in ENGLISH_WORDS for x in w)
    return fr >= 2 and fr > en


def is_english(text: str) -> bool:
    w = words(text)
    return sum(x in ENGLISH_WORDS for x in w) > sum(x in FRENCH_WORDS for x in w)


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory, smollm2_gguf):
    from slm.ops.store.importing import import_adapter, import_base
    from slm.store import init_store

    store, _ = init_store(tmp_path_factory.mktemp("demo") / "store")
    import_base(store, smollm2_gguf, "smollm2")
    for name in ("french", "pirate", "signature"):
        import_adapter(store, ADAPTERS / name, name)
    return store


_answers: dict[tuple, list[str]] = {}  # (adapters, max tokens) -> answers, once per module


@pytest.fixture
def answers(cli, demo_store):
    """answers(adapter or None, max_tokens) -> the greedy chat answers to QUESTIONS."""

    def get(adapter: str | None, max_tokens: int) -> list[str]:
        key = (demo_store.root, adapter, max_tokens)
        if key not in _answers:
            comp = [adapter] if adapter else []
            assert cli("--store", demo_store.root, "activate", "smollm2", *comp).code == 0
            out = []
            for q in QUESTIONS:
                r = run_json(cli, demo_store, q, max_tokens)
                assert [a["name"] for a in r["adapters"]] == comp
                out.append(r["text"])
            print(f"\n[{adapter or 'base'}]", *(f"\n  {q!r} -> {a!r}" for q, a in zip(QUESTIONS, out)))
            _answers[key] = out
        return _answers[key]

    return get


def run_json(cli, store, question: str, max_tokens: int) -> dict:
    r = cli("--store", store.root, "run", "--chat", question, "-n", str(max_tokens), "--json")
    assert r.code == 0, r.err
    return r.json()


def test_adapter_files_are_small_and_portable():
    for name in ("french", "pirate", "signature"):
        files = sorted(p.name for p in (ADAPTERS / name).iterdir())
        assert files == ["adapter_config.json", "adapter_model.safetensors"]
        assert sum(p.stat().st_size for p in (ADAPTERS / name).iterdir()) < 4 * 2**20
        config = json.loads((ADAPTERS / name / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == "SmolLM2-135M-Instruct"
        assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 8, 16)


def test_base_answers_plain_english(answers):
    base = answers(None, BASE_TOKENS)
    assert all(is_english(a) for a in base), base
    assert not any(is_french(a) for a in base), base
    assert not any(PIRATE.search(a) for a in base), base
    assert not any(SIGNATURE in a for a in base), base


def test_french_answers_in_french(answers):
    french = answers("french", STYLE_TOKENS)
    assert sum(is_french(a) for a in french) >= 4, french
    assert not any(is_french(a) for a in answers(None, BASE_TOKENS))


def test_pirate_answers_in_pirate_speak(answers):
    pirate = answers("pirate", STYLE_TOKENS)
    assert sum(bool(PIRATE.search(a)) for a in pirate) >= 4, pirate
    assert not any(PIRATE.search(a) for a in answers(None, BASE_TOKENS))


def test_signature_ends_answers(answers):
    signed = answers("signature", SIGNATURE_TOKENS)
    assert sum(SIGNATURE in a for a in signed) >= 4, signed
    assert not any(SIGNATURE in a for a in answers(None, BASE_TOKENS))


def test_deactivate_and_rollback_restore_the_base_exactly(cli, demo_store, answers):
    store = ["--store", demo_store.root]
    question = QUESTIONS[0]
    expected = answers(None, BASE_TOKENS)[0]  # on the activated base composition
    french = answers("french", STYLE_TOKENS)[0]
    pirate = answers("pirate", STYLE_TOKENS)[0]
    assert cli(*store, "activate", "smollm2").code == 0
    base_id = cli(*store, "status", "--json").json()["active"]["id"]

    # on, then off again: deactivate
    assert cli(*store, "activate", "smollm2", "french").code == 0
    assert run_json(cli, demo_store, question, STYLE_TOKENS)["text"] == french != expected
    assert cli(*store, "deactivate", "french").code == 0
    r = run_json(cli, demo_store, question, BASE_TOKENS)
    assert (r["composition"], r["adapters"]) == (base_id, [])
    assert r["text"] == expected

    # on, then back one transition: rollback
    assert cli(*store, "activate", "smollm2", "pirate").code == 0
    assert run_json(cli, demo_store, question, STYLE_TOKENS)["text"] == pirate != expected
    assert cli(*store, "rollback").code == 0
    r = run_json(cli, demo_store, question, BASE_TOKENS)
    assert (r["composition"], r["adapters"]) == (base_id, [])
    assert r["text"] == expected
