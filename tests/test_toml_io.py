"""Manifest TOML is written byte for byte as tomlkit writes it (a manifest's digest is the hash
of those bytes): slm.compose.toml_io writes the plain shapes itself and must agree with tomlkit
on every document it takes, and leave every other one to tomlkit."""

from __future__ import annotations

import tomlkit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slm.compose import toml_io

_SETTINGS = settings(max_examples=250, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow])

keys = st.one_of(st.from_regex(r"[a-z_][a-z0-9_-]{0,8}", fullmatch=True), st.text(max_size=4))
scalars = st.one_of(
    st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.from_regex(r"[ -~]{0,20}", fullmatch=True),  # printable ASCII, the quote and backslash included
)
values = st.one_of(scalars, st.lists(scalars, max_size=4))
scalar_tables = st.dictionaries(keys, values, max_size=4)
sub_tables = st.one_of(scalar_tables, st.dictionaries(keys, scalar_tables, max_size=3))
entries = st.builds(lambda a, b: {**a, **{k: v for k, v in b.items() if k not in a}},
                    scalar_tables, st.dictionaries(keys, sub_tables, max_size=2))
documents = st.builds(
    lambda top, rest: {**top, **{k: v for k, v in rest.items() if k not in top}},
    st.dictionaries(keys, values, max_size=5),
    st.dictionaries(keys, st.one_of(scalar_tables, st.lists(entries, min_size=0, max_size=3), values),
                    max_size=4),
)

# the plain shapes themselves, so that most examples take the plain path
bare = st.from_regex(r"[a-z][a-z0-9_]{0,5}", fullmatch=True)
plain_scalars = st.one_of(st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                          st.from_regex(r"[a-zA-Z0-9:._ -]{0,16}", fullmatch=True))
plain_values = st.one_of(plain_scalars, st.lists(plain_scalars, max_size=3))
plain_tables = st.dictionaries(bare, plain_values, min_size=1, max_size=4)
plain_subs = st.one_of(plain_tables, st.dictionaries(bare, plain_tables, min_size=1, max_size=3))
plain_entries = st.builds(lambda a, b: {**a, **{k: v for k, v in b.items() if k not in a}},
                          plain_tables, st.dictionaries(bare, plain_subs, max_size=2))
plain_documents = st.builds(
    lambda top, rest: {**top, **{k: v for k, v in rest.items() if k not in top}},
    st.dictionaries(bare, plain_values, max_size=4),
    st.dictionaries(bare, st.one_of(plain_tables, st.lists(plain_entries, min_size=1, max_size=3)), max_size=3),
)


@_SETTINGS
@given(st.one_of(documents, plain_documents))
def test_the_plain_writer_agrees_with_tomlkit_or_declines(doc):
    mine = toml_io._plain_dumps(doc)
    if mine is not None:
        assert mine == tomlkit.dumps(doc)
    assert toml_io.dumps(doc) == tomlkit.dumps(doc).encode("utf-8")


def test_manifest_shapes_take_the_plain_path():
    """A base manifest's and an adapter manifest's shapes are the ones written without tomlkit."""
    base = {"schema": "slm.base/1", "source_format": "gguf", "quant_profile": "q4_1",
            "architecture": {"family": "llama", "rms_norm_eps": 1e-05, "tie_word_embeddings": True},
            "tokenizer": {"digest": "blake3:" + "0" * 64, "source": "gguf"},
            "tensors": [{"name": "a.weight", "shape": [4, 8], "dtype": "q8_0", "nbytes": 34}]}
    adapter = {"schema": "slm.adapter/1", "kind": "lora", "requires": {"hidden_size": 8},
               "targets": [{"module": "blk.0.attn_q.weight", "scale": 2.0, "rank": 4,
                            "tensors": {"A": {"digest": "blake3:" + "1" * 64, "shape": [4, 8]},
                                        "B": {"digest": "blake3:" + "2" * 64, "shape": [8, 4]}}}]}
    for doc in (base, adapter):
        assert toml_io._plain_dumps(doc) is not None
        assert toml_io.dumps(doc) == tomlkit.dumps(doc).encode("utf-8")
