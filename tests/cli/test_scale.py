"""Scale hygiene (issue 35): a GGUF import streams the file (never holds it whole), its blobs are
recorded verified as they are committed (the first activation after an import re-hashes
nothing), and what the fast path trusts is still refused once damaged (docs/recovery.md)."""

from __future__ import annotations

import errno
import os
import shutil
import sys

import pytest

import make_shape_gguf
import slm
from helpers import VERIFIED_CACHE, one_line, peak_rss_of, refused, snapshot, wait_until
from slm.compose.base_manifest import parse_base_manifest
from slm.formats import gguf
from slm.ops.store import importing
from slm.store import digest as dg
from slm.store import objects as objects_module
from slm.store import verified

# Two files with the same vocabulary (SmolLM2's) and header, one with ~80 MB of weights, one
# with ~18 MB: what a streaming import holds beyond its start-up is the difference of the two.
BIG = dict(hidden=1024, ffn=4096, layers=2, heads=16, kv_heads=4, vocab=49152, tied=False)
SMALL = dict(hidden=256, ffn=256, layers=1, heads=4, kv_heads=2, vocab=49152, tied=False)
TEST_PIECE = 1 << 20


@pytest.fixture(scope="module")
def shaped(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("shaped")
    files = {}
    for name, shape in (("big", BIG), ("small", SMALL)):
        make_shape_gguf.SHAPES[f"test-{name}"] = shape
        try:
            make_shape_gguf.write(out / f"{name}.gguf", f"test-{name}", "Q4_0")
        finally:
            del make_shape_gguf.SHAPES[f"test-{name}"]
        files[name] = out / f"{name}.gguf"
    return files


def _import_in_child(store_dir, path) -> int:
    """The peak RSS of a fresh `slm import base` of `path` with pieces of TEST_PIECE bytes."""
    code = ("import sys; import slm.ops.store.importing as i; i.PIECE_BYTES = int(sys.argv[1]); "
            "from slm.cli import run; sys.exit(run(sys.argv[2:]))")
    peak, _ = peak_rss_of([sys.executable, "-c", code, str(TEST_PIECE), "--store", str(store_dir),
                           "import", "base", str(path), "--name", path.stem])
    return peak


def test_a_gguf_import_holds_pieces_of_the_file_never_the_file(shaped, tmp_path):
    slm.Store.init(tmp_path / "store")
    small = _import_in_child(tmp_path / "store", shaped["small"])
    big = _import_in_child(tmp_path / "store", shaped["big"])
    weights = shaped["big"].stat().st_size - shaped["small"].stat().st_size
    assert weights > 32 * TEST_PIECE
    # holding the file (as a map read whole, or a copy) would add all of `weights`; the pieces in
    # flight (PREFETCH + 1 tensors, one piece each) and the threads' stacks are a few MB
    assert big - small < weights // 4, (big, small, weights)


def test_a_gguf_import_reads_tensors_in_bounded_pieces(shaped, tmp_path, monkeypatch):
    reference = slm.Store.init(tmp_path / "one").import_base(shaped["big"], "b").digest
    sizes: list[int] = []
    real_pieces = gguf.GGUFFile.tensor_pieces

    def pieces(self, info, piece_bytes):
        for piece in real_pieces(self, info, piece_bytes):
            sizes.append(len(piece))
            yield piece

    def whole(self, info):
        raise AssertionError(f"tensor {info.name} was read whole")

    monkeypatch.setattr(gguf.GGUFFile, "tensor_pieces", pieces)
    monkeypatch.setattr(gguf.GGUFFile, "tensor_bytes", whole)
    monkeypatch.setattr(importing, "PIECE_BYTES", TEST_PIECE)
    store = slm.Store.init(tmp_path / "two")
    result = store.import_base(shaped["big"], "b")
    assert max(sizes) <= TEST_PIECE and len(sizes) > 64
    assert sum(sizes) == result.total_bytes
    assert result.digest == reference  # hashed in pieces: the same digests as hashed whole
    assert all(store._s.objects.verify(d) for d in _base_blobs(store))  # copied as hashed


def test_an_import_copies_through_a_buffer_where_the_kernel_cannot(shaped, tmp_path, monkeypatch):
    reference = slm.Store.init(tmp_path / "one").import_base(shaped["small"], "b").digest
    calls = []

    def refuse(*args):
        calls.append(args)
        raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

    monkeypatch.setattr(os, "copy_file_range", refuse, raising=False)
    store = slm.Store.init(tmp_path / "two")
    assert store.import_base(shaped["small"], "b").digest == reference
    assert calls, "the kernel copy was not tried"
    s = store._s
    base = parse_base_manifest(s.objects.read_verified(s.names.get("bases", "b")))
    assert all(s.objects.verify(d) for d in base.blob_digests())


def test_a_source_written_during_its_import_is_refused(shaped, cli, store, store_dir, tmp_path, monkeypatch):
    source = shutil.copy(shaped["small"], tmp_path / "growing.gguf")
    real_put_range = objects_module.Staging.put_range

    def put_range_then_append(self, digest, rng):
        found = real_put_range(self, digest, rng)
        with open(source, "ab") as f:  # someone still writing the file
            f.write(b"\0")
        return found

    monkeypatch.setattr(objects_module.Staging, "put_range", put_range_then_append)
    r = refused(cli, store_dir, 4, "import", "base", source, "--name", "g")  # the store unchanged
    assert "written to while it was imported" in r.err


def _settled_copy(src, dst):
    """A copy of `src` whose ctime is verified.RACY_NS in the past: an import can show that it
    did not change (GGUFFile.unchanged_since_opened)."""
    shutil.copy(src, dst)
    ctime = dst.stat().st_ctime_ns
    probe = dst.parent / ".clock-probe"

    def old_enough() -> bool:
        probe.touch()  # its times are the kernel's clock as files see it
        return probe.stat().st_ctime_ns > ctime + gguf.RACY_NS

    wait_until(old_enough, "a file time past the copy's racy window")
    return dst


def _base_blobs(store) -> set[str]:
    s = store._s
    return set(parse_base_manifest(s.objects.read_verified(s.names.get("bases", "b"))).blob_digests())


def _hashed_files(monkeypatch) -> list[str]:
    """Every blob whose file is re-hashed from now on."""
    seen: list[str] = []
    real = objects_module.ObjectStore.hash_file

    def hash_file(self, digest):
        seen.append(digest)
        return real(self, digest)

    monkeypatch.setattr(objects_module.ObjectStore, "hash_file", hash_file)
    return seen


def test_the_first_activation_after_an_import_re_hashes_no_blob(shaped, tmp_path, monkeypatch):
    source = _settled_copy(shaped["small"], tmp_path / "b.gguf")
    store = slm.Store.init(tmp_path / "store")
    store.import_base(source, "b")
    hashed = _hashed_files(monkeypatch)
    slm.Store.open(tmp_path / "store").activate("b")  # a new Store: the cache from its file
    assert not _base_blobs(store) & set(hashed), "a blob the import wrote was re-hashed"


def test_a_blob_written_to_after_its_import_is_refused_at_activation(shaped, tmp_path, cli):
    source = _settled_copy(shaped["small"], tmp_path / "b.gguf")
    store_dir = tmp_path / "store"
    slm.Store.init(store_dir).import_base(source, "b")
    blobs = _base_blobs(slm.Store.open(store_dir))
    victim = store_dir / "objects" / "blake3" / dg.hex_of(max(sorted(blobs), key=lambda d: (
        store_dir / "objects" / "blake3" / dg.hex_of(d)).stat().st_size))
    os.chmod(victim, 0o644)
    with open(victim, "r+b") as f:  # same size, one byte flipped: only the file's times move
        f.seek(victim.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.chmod(victim, 0o444)
    before = snapshot(store_dir)
    r = cli("--store", store_dir, "activate", "b")
    assert r.code == 5 and one_line(r.err) and "corrupt" in r.err, (r.code, r.err)
    assert snapshot(store_dir) == before


def test_a_blob_changed_with_its_mtime_put_back_is_refused_at_activation(shaped, tmp_path, cli):
    """The pinned mtime put back by hand (os.utime): the ctime, which only the kernel sets,
    moves, once the file clock has passed the blob's own ctime."""
    source = _settled_copy(shaped["small"], tmp_path / "b.gguf")
    store_dir = tmp_path / "store"
    slm.Store.init(store_dir).import_base(source, "b")
    victim = store_dir / "objects" / "blake3" / dg.hex_of(sorted(_base_blobs(slm.Store.open(store_dir)))[0])
    before = victim.stat()
    probe = tmp_path / ".clock-probe"

    def clock_past() -> bool:
        probe.touch()
        return probe.stat().st_ctime_ns > before.st_ctime_ns

    wait_until(clock_past, "a file time past the blob's ctime")
    os.chmod(victim, 0o644)
    data = bytearray(victim.read_bytes())
    data[0] ^= 0xFF
    victim.write_bytes(data)
    os.chmod(victim, 0o444)
    os.utime(victim, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (victim.stat().st_size, victim.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    r = cli("--store", store_dir, "activate", "b")
    assert r.code == 5 and one_line(r.err), (r.code, r.err)


def test_committed_blobs_keep_a_pinned_mtime_and_are_recorded(shaped, tmp_path):
    source = _settled_copy(shaped["small"], tmp_path / "b.gguf")
    store_dir = tmp_path / "store"
    store = slm.Store.init(store_dir)
    store.import_base(source, "b")
    records = verified._parse((store_dir / VERIFIED_CACHE).read_bytes())
    for digest in _base_blobs(store):
        info = (store_dir / "objects" / "blake3" / dg.hex_of(digest)).lstat()
        assert records[dg.hex_of(digest)] == verified.spell(verified.key_of(info))
        assert info.st_mtime_ns < info.st_ctime_ns - objects_module.PIN_AGE_NS // 2


def test_loading_gives_the_tokenizers_garbage_back_before_the_weights_are_read(tiny_model, tmp_path,
                                                                               monkeypatch):
    """What building the tokenizer freed (its vocabulary parsed into Python objects, then handed
    to the Rust library) is given back to the kernel once the model is built, before a prompt
    touches a weight page: `slm run` keeps freed heap blocks for its prompts
    (slm.model.allocator), so without this the garbage of a 128k-token vocabulary stays resident
    beside the mapped weights."""
    from slm.ops.infer import loading

    events: list[str] = []
    real_tokenizer, real_tensors = loading.load_tokenizer, loading.load_tensors
    monkeypatch.setattr(loading, "load_tokenizer", lambda doc: events.append("tokenizer") or real_tokenizer(doc))
    monkeypatch.setattr(loading, "load_tensors", lambda *a: events.append("weights mapped") or real_tensors(*a))
    monkeypatch.setattr(loading, "release_freed_memory", lambda: events.append("released") or True)
    store = slm.Store.init(tmp_path / "store")
    store.import_base(tiny_model["gguf_q"], "tq")
    loaded = loading.load_base_model(store._s, "tq")
    assert events == ["tokenizer", "weights mapped", "released"]
    assert loaded.tokenizer.encode("hello")  # still usable: only garbage was given back


def _gguf_tokenizer(path):
    from slm.formats.gguf_model import tokenizer_doc_from_gguf
    from slm.model.tokenizer import load_tokenizer

    with gguf.read_gguf(path) as g:
        doc = tokenizer_doc_from_gguf(g)
    return doc, load_tokenizer(doc)


def _random_ids(rng, vocab_size: int, specials: list[int]) -> list[int]:
    """Ids of every kind: ordinary tokens, special ones, a few past the vocabulary."""
    choices = []
    for _ in range(rng.randrange(1, 14)):
        r = rng.random()
        choices.append(rng.choice(specials) if r < 0.2 and specials else
                       vocab_size + rng.randrange(4) if r < 0.25 else rng.randrange(vocab_size))
    return choices


@pytest.mark.parametrize("which", ["smollm2", "padded"])
def test_a_released_tokenizer_decodes_as_the_tokenizer_did(which, smollm2_gguf, shaped):
    """After release_encoder (slm run, once its prompt is encoded), decode is ByteLevelPieces':
    the same text as the Hugging Face tokenizer's on any ids, special ones with special=True and
    False, broken characters, ids past the vocabulary. `padded`: SmolLM2's vocabulary padded to
    49,152 + reserved control tokens by make_shape_gguf; `smollm2`: the real file's."""
    import random

    path = smollm2_gguf if which == "smollm2" else shaped["small"]
    _, reference = _gguf_tokenizer(path)
    _, released = _gguf_tokenizer(path)
    assert released.release_encoder()
    assert released.codec.tokenizer is None  # the Rust tokenizer is gone, not kept beside
    specials = sorted(reference.codec.tokenizer.get_added_tokens_decoder())
    rng = random.Random(35)
    for _ in range(2000):
        ids = _random_ids(rng, reference.vocab_size, specials)
        for special in (False, True):
            assert released.decode(ids, special=special) == reference.decode(ids, special=special), (ids, special)
    text = "naïve café 😀 <|im_start|>x"
    assert released.decode(reference.encode(text, add_special=False)) == reference.decode(
        reference.encode(text, add_special=False))


def test_a_vocabulary_with_user_defined_tokens_keeps_its_tokenizer(tiny_model):
    """ByteLevelPieces is shown equal only where every added token is special: a vocabulary with
    a user-defined token (matched whole, decoded as written) keeps the Rust tokenizer."""
    import json

    from slm.model.gguf_vocab import USER_DEFINED
    from slm.model.tokenizer import load_tokenizer

    doc, _ = _gguf_tokenizer(tiny_model["gguf_q"])
    parsed = json.loads(doc)
    fields = parsed["fields"]
    fields["ggml.token_type"] = list(fields["ggml.token_type"])
    fields["ggml.token_type"][len(fields["ggml.tokens"]) - 1] = USER_DEFINED
    tok = load_tokenizer(json.dumps(parsed).encode())
    ids = tok.encode("hello world")
    assert tok.release_encoder() is False
    assert tok.encode("hello world") == ids  # nothing was released


def test_slm_run_releases_the_encoder_once_its_prompt_is_encoded(tiny_model, tmp_path, monkeypatch):
    from slm.model import tokenizer as tokenizer_module
    from slm.api import GenerationRequest
    from slm.ops.infer.run import RunOptions

    store = slm.Store.init(tmp_path / "store")
    store.import_base(tiny_model["gguf_q"], "tq")
    store.activate("tq")
    events: list[str] = []
    real_encode, real_release = tokenizer_module.TextTokenizer.encode, tokenizer_module.TextTokenizer.release_encoder
    monkeypatch.setattr(tokenizer_module.TextTokenizer, "encode",
                        lambda self, *a, **k: events.append("encode") or real_encode(self, *a, **k))
    monkeypatch.setattr(tokenizer_module.TextTokenizer, "release_encoder", lambda self: False)
    kept = store.run(RunOptions(GenerationRequest("hello world", max_tokens=12)))  # the tokenizer kept whole
    monkeypatch.setattr(tokenizer_module.TextTokenizer, "release_encoder",
                        lambda self: events.append(f"released: {real_release(self)}"))
    events.clear()
    released = store.run(RunOptions(GenerationRequest("hello world", max_tokens=12)))
    assert events == ["encode", "released: True"]
    assert kept.text and (released.tokens, released.text) == (kept.tokens, kept.text)
