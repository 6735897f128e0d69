"""Manifest TOML is written byte for byte as tomlkit writes it (a manifest's digest is the hash
of those bytes): slm.compose.toml_io writes the plain shapes itself and must agree with tomlkit
on every document it takes, and leave every other one to tomlkit."""

from __future__ import annotations

import pytest
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


def _tomllib(text: str):
    import tomllib

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return "refused"


@_SETTINGS
@given(plain_documents)
def test_the_plain_reader_reads_what_the_writer_writes_as_tomllib_does(doc):
    text = toml_io.dumps(doc).decode("utf-8")
    assert toml_io._plain_loads(text) == _tomllib(text) == doc


def test_spellings_read_once_give_each_entry_its_own_values():
    """The plain reader reads each spelling once per text (a manifest repeats its keys, shapes
    and headers on every entry): every entry still gets tomllib's values, and lists of its own."""
    entry = {"module": "m", "scale": 2.0, "on": True,
             "tensors": {"A": {"dtype": "f32", "shape": [16, 576]}, "B": {"dtype": "f32", "shape": [576, 16]}}}
    doc = {"schema": "s", "shape": [16, 576], "targets": [entry, dict(entry), dict(entry)]}
    text = toml_io.dumps(doc).decode("utf-8")
    mine = toml_io._plain_loads(text)
    assert mine == _tomllib(text) == doc
    shapes = [mine["shape"]] + [t["tensors"][k]["shape"] for t in mine["targets"] for k in "AB"]
    assert len({id(s) for s in shapes}) == len(shapes)
    shapes[1].append(1)  # a caller changing one list changes no other
    assert mine["targets"][1]["tensors"]["A"]["shape"] == [16, 576] == mine["shape"]
    assert toml_io._plain_loads(text.replace("[targets.tensors.B]", "[targets.tensors.A]", 1)) is None


line_edits = st.lists(st.tuples(st.sampled_from(["drop", "repeat", "swap", "cut", "insert"]),
                                st.integers(min_value=0, max_value=10**6),
                                st.sampled_from(["[", "]", "[[", ".", " = ", "\"", "\\", "#", "=", " ", "x",
                                                 "[a]", "[[a]]", "a = 1", "1e5", "+1", "1_0", "0x1",
                                                 "nan", "\t", ",", "{}", "'s'", "é"])),
                      min_size=1, max_size=4)


@_SETTINGS
@given(plain_documents, line_edits)
def test_the_plain_reader_agrees_with_tomllib_on_damaged_text_or_declines(doc, edits):
    """Damaged manifests (lines dropped, repeated, swapped, cut, text inserted): the plain
    reader returns tomllib's document, or None when tomllib refuses or the text is not plain."""
    lines = toml_io.dumps(doc).decode("utf-8").split("\n")
    for kind, where, text in edits:
        i = where % max(1, len(lines))
        if kind == "drop" and lines:
            del lines[i]
        elif kind == "repeat" and lines:
            lines.insert(i, lines[i])
        elif kind == "swap" and len(lines) > 1:
            lines[i], lines[i - 1] = lines[i - 1], lines[i]
        elif kind == "cut" and lines and lines[i]:
            lines[i] = lines[i][: where % len(lines[i])]
        else:
            line = lines[i] if lines else ""
            at = where % (len(line) + 1)
            lines[i:i + 1] = [line[:at] + text + line[at:]]
    text = "\n".join(lines)
    mine = toml_io._plain_loads(text)
    if mine is not None:
        assert mine == _tomllib(text)


@pytest.mark.parametrize("text", [
    'a = 1\na = 2\n',  # a key twice
    '[t]\nx = 1\n[t]\ny = 2\n',  # a table twice
    '[[e]]\nx = 1\n[e.s]\ny = 1\n[e.s]\nz = 1\n',  # a sub-table twice in one entry
    '[[e]]\nx = 1\n[e.s.a]\ny = 1\n[e.s]\nz = 1\n',  # a super table defined after its sub-table
    '[[e]]\nx = 1\ns = 2\n[e.s.a]\ny = 1\n',  # a value, then a table of the same name
    '[t]\nx = 1\n[[t]]\ny = 1\n',  # a table, then an array of tables of the same name
    '[[t]]\nx = 1\n[t]\ny = 1\n',
    '[t]\nx = 1\n[t.s]\ny = 1\n',  # a sub-table of a plain table (tomllib reads it)
    'a = "x\\"y"\n', 'a = "\\u00e9"\n', 'a = 1 # note\n', 'a = {x = 1}\n', 'a = nan\n', 'a = +1\n',
    'a = 1_000\n', 'a = 0x1f\n', 'a = 01\n', 'a = 1.\n', "a = 'x'\n", 'a = [1,2]\n', 'a = [[1]]\n',
    '"a" = 1\n', 'a.b = 1\n', 'a  = 1\n', 'a = 1 \n', ' a = 1\n', 'a = 1\r\n', '[ t ]\n', '[t]]\n',
    'a = "é"\n', 'a = 1979-05-27\n', 'a = inf\n',
])
def test_what_the_plain_reader_leaves_to_tomllib(text):
    assert toml_io._plain_loads(text) is None
    _tomllib(text)  # whatever tomllib makes of it, it is tomllib's call (loads() asks it)
