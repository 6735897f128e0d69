"""`slm import base|adapter`: a file becomes blobs, a manifest and a name.

Everything is read and checked before the store changes; blobs are staged under tmp/ (with
the manifest), an intent is journaled, the blobs are committed together, the name is set (THE
COMMIT POINT: the rename of names/<kind>/<name>), the intent is cleared. A failure before the
name is set is undone before the command returns (the blobs it added are unlinked, the intent
cleared): the store is as it was. A failure after it exits INCOMPLETE (13): the import is
committed, `slm fsck --repair` clears the intent. A crash is recovered by `slm fsck --repair`
(`recover`: it sets the name if every blob is there, else undoes the import).
"""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from slm.compose.adapter_manifest import (AdapterManifest, TargetRecord, TensorRef, parse_adapter_manifest,
                                          tensor_bytes)
from slm.compose.base_manifest import BaseManifest, TensorRecord, parse_base_manifest, tensor_order
from slm.compose.validate import check_adapter_fits
from slm.errors import InvalidInput, NotFound, SlmError
from slm.formats.adapter_source import AdapterSource
from slm.formats.base_source import BaseSource, canonical_json
from slm.formats.base_origin import origin_record
from slm.formats.gguf_frame import SCHEMA as FRAME_SCHEMA
from slm.formats.gguf import MAGIC
from slm.formats.gguf_lora import is_gguf_lora, read_gguf_lora
from slm.formats.gguf_model import open_gguf_base
from slm.formats.hf_checkpoint import is_hf_checkpoint, open_hf_base
from slm.formats.peft import is_peft_dir, read_peft_adapter
from slm.formats.untrusted import open_binary
from slm.model.tokenizer import check_tokenizer
from slm.ops.store import naming
from slm.ops.progress import NoProgress, Progress
from slm.ops.store.resolve import load_base
from slm.quant import get_codec
from slm.ops.results import ImportResult
from slm.store import StoreDir, fs
from slm.store import digest as dg
from slm.store.journal import Intent, intent_name
from slm.store.transaction import Recovery, Seen

KIND = "import"  # journal/import-<base|adapter>-<name>.intent


def open_base_source(path: Path, quant: str | None) -> BaseSource:
    if not path.exists():
        raise NotFound(f"no such file or directory: {path}")
    if path.is_file():
        with open_binary(path) as f:
            magic = f.read(4)
        if magic != MAGIC:
            raise InvalidInput(f"{path.name}: not a GGUF file or a Hugging Face checkpoint directory")
        if quant is not None:
            raise InvalidInput("--quant applies to Hugging Face checkpoints; GGUF tensors are kept as stored")
        return open_gguf_base(path)
    if is_hf_checkpoint(path):
        return open_hf_base(path, quant or "q8_0")
    raise InvalidInput(
        f"{path}: not a checkpoint (expected a .gguf file or a directory with config.json)"
    )


def _check_name_free(store: StoreDir, kind: str, name: str) -> None:
    """Fail fast, before minutes of staging, on a bad name or a damaged name file (the name is
    claimed again under the lock at commit time: another process may take it meanwhile)."""
    naming.claim(store, kind + "s", name)


def _commit_named(store: StoreDir, staging, kind: str, name: str, manifest: bytes,
                  side_names: tuple[tuple[str, str], ...] = ()) -> tuple[str, list[str], str | None]:
    """Stage the manifest, then under the store lock: journal the intent, commit every staged
    blob, move the name. Staging ran without the lock (a checkpoint may take minutes to
    quantize; activations must not wait for it). Returns (manifest digest, digests new to the
    store, what the name pointed at before if this import moved it). `side_names` ((kind,
    digest) of SIDE_KINDS, slm.store.names) are set to their digest under the manifest's hex
    after the commit point, still under the lock (so no gc sees their blobs unnamed), unless
    an earlier import of the same base set them (Names.set_once): a crash between the two
    leaves the import without them, which importing the file again sets."""
    digest = staging.put(manifest)
    fs.point("import.staged")
    with store.locked():
        committed = _commit_locked(store, staging, kind, name, digest)
        for side_kind, side_digest in side_names:
            store.names.set_once(side_kind, dg.hex_of(digest), side_digest)
        return committed


def _commit_locked(store: StoreDir, staging, kind: str, name: str, digest: str) -> tuple[str, list[str], str | None]:
    kinds = kind + "s"
    naming.claim(store, kinds, name)
    existing = store.names.get(kinds, name)
    log_state = naming.open_log(store, kinds, name)[1] if existing != digest else None
    with store.transaction(intent_name(KIND, f"{kind}-{name}"), "import", digest, old=existing,
                           created=existing is None, done=f"{kind} {name!r} is imported") as tx:
        new: list[str] = []
        tx.on_undo(lambda: store.objects.remove_new(new))
        fs.point("import.before-commit")
        new.extend(staging.commit())
        fs.point("import.before-name")
        if log_state is None:  # the same bytes again: the name stays where it is
            tx.commit()
        else:  # the commit point: the name's reflog line, then the name file (slm.ops.store.naming)
            naming.move_steps(store, tx, kinds, name, existing, digest, "import", log_state)
    return digest, new, None if existing == digest else existing


def recover(store: StoreDir, intent: Intent, seen: Seen) -> Recovery:
    """An interrupted import is finished (the name's reflog line if it is missing, then the
    name) when its manifest and every blob it names are intact and the name is still where
    the import found it or already moved; else undone (`slm gc` removes what it stored)."""
    kind, _, name = intent.key.partition("-")
    if kind not in ("base", "adapter") or not name:
        return Recovery(f"journal/{intent.name}.intent: an import intent with a malformed name", "remove it")
    kinds = kind + "s"
    parse = parse_base_manifest if kind == "base" else parse_adapter_manifest
    try:
        complete = seen.intact(intent.new) and all(
            seen.intact(d) for d in parse(store.objects.read_verified(intent.new)).blob_digests())
        current = store.names.get(kinds, name)
    except SlmError:
        complete, current = False, None
    if not complete or current not in (intent.old, intent.new):
        return Recovery(f"interrupted import of {kind} {name!r} (not all blobs stored)",
                        "undo it (`slm gc` removes what it stored)")

    def finish() -> None:
        naming.log_missing_line(store, kinds, name, intent.old, intent.new, "import")
        store.names.set(kinds, name, intent.new)
    return Recovery(f"interrupted import of {kind} {name!r} (all its blobs are stored)",
                    f"finish it: name {name!r} -> {dg.short(intent.new)}", finish)


def import_base(store: StoreDir, path: Path, name: str, quant: str | None = None,
                progress: Progress | None = None) -> ImportResult:
    progress = progress or NoProgress()
    _check_name_free(store, "base", name)
    started = time.perf_counter()
    source = open_base_source(Path(path), quant)
    try:
        return _store_base(store, source, name, progress, started, Path(path))
    finally:
        source.close()


def _store_base(store: StoreDir, source: BaseSource, name: str, progress: Progress,
                started: float, path: Path) -> ImportResult:
    staging = store.objects.staging()
    try:
        manifest, side_names = stage_base(staging, source, progress, origin=path)
        digest, new, previous = _commit_named(store, staging, "base", name, manifest.to_bytes(), side_names)
    finally:
        staging.discard()
    return _result(store, "base", name, digest, source.format, len(manifest.tensors), manifest.dtype_counts(),
                   manifest.total_bytes, new, previous, started)


def stage_base(staging, source: BaseSource, progress: Progress,
               origin: Path | None = None) -> tuple[BaseManifest, tuple[tuple[str, str], ...]]:
    """Stage a base's tensors, tokenizer and GGUF frame (not its manifest) into `staging`: its
    manifest and side names (see _commit_named). The one path from a BaseSource to blobs, for
    `slm import base` and a GGUF pulled from a registry (slm.ops.ship.model_pull) alike. `origin`:
    the file or directory imported, recorded as where the base came from (a pulled base has
    none: the store only received it)."""
    order = tensor_order(source.architecture)
    tensors = sorted(source.tensors, key=lambda t: order[t.name])
    # The next tensors' bytes are produced (read, or quantized from a checkpoint) and checked
    # finite on a thread (NumPy releases the GIL) while this one is hashed and written; errors
    # still come in tensor order, and at most PREFETCH tensors wait in memory.
    checker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="slm-tensors")
    try:
        progress.start("importing tensors", sum(t.nbytes for t in tensors))
        records = []
        for t, (data, size, finite) in zip(tensors, _prefetched(checker, _checked, tensors)):
            if size != t.nbytes:
                raise InvalidInput(f"tensor {t.name}: {size} bytes, expected {t.nbytes}")
            if not finite:
                raise InvalidInput(f"tensor {t.name} holds values that are not finite (NaN or inf)")
            if isinstance(data, str):  # streamed: hashed in pieces, copied by the kernel
                fd, offset = t.file_range()
                digest = staging.put_range(data, fs.FileRange(fd, offset, size))
            else:
                digest = staging.put(data)
            records.append(TensorRecord(t.name, t.shape, t.dtype, t.nbytes, digest))
            progress.advance(t.nbytes)
        progress.finish()
        # serialised while the tensors' copies and fsyncs finish (a whole vocabulary and its merges
        # as JSON: Python work that would otherwise wait for them, or hold them up)
        tokenizer_doc = source.tokenizer_doc()
        check_tokenizer(tokenizer_doc)  # refused now, not at every run
        tokenizer_digest = staging.put(tokenizer_doc)
        origins = () if origin is None else (("origins", staging.put(origin_record(origin, source.hub_id))),)
        side_names = (*origins, *_stage_gguf_frame(source, staging))
        _check_source_unchanged(source, staging)
        manifest = BaseManifest(
            source_format=source.format,
            quant_profile=source.quant_profile,
            qk_row_layout=source.qk_row_layout,
            architecture=source.architecture,
            tokenizer_digest=tokenizer_digest,
            tokenizer_source=source.format,
            tensors=tuple(records),
        )
        return manifest, side_names
    finally:
        checker.shutdown(cancel_futures=True)


def _stage_gguf_frame(source: BaseSource, staging) -> tuple[tuple[str, str], ...]:
    """Stage what else a GGUF file holds (slm.formats.gguf_frame), so `slm export --format gguf`
    gives the file back byte for byte: its header blob and a record naming it."""
    frame = source.gguf_frame()
    if frame is None:
        return ()
    record = canonical_json({"schema": FRAME_SCHEMA, "header": staging.put(frame.header), "size": frame.size})
    return (("gguf", staging.put(record)),)


PREFETCH = 2
# the most bytes of a source file an import holds at once per tensor in flight (PREFETCH + 1):
# a GGUF is read in pieces of this size, each let go of before the next, so that an import's
# memory does not grow with the size of the model
PIECE_BYTES = 16 << 20


def _checked(t) -> tuple[bytes | memoryview | str, int, bool]:
    """(what to stage, its size, whether its values are all finite) for a source tensor (a
    tensor of the wrong size is left to the size check, which names it). What to stage: the
    bytes as they will be stored, or for a tensor stored byte for byte from a file (GGUF) their
    digest, the bytes read in pieces of at most PIECE_BYTES (never held whole: the file is then
    copied by the kernel, `_store_base`)."""
    if t.pieces is None or t.file_range is None:
        data = t.stored_bytes()
        return data, len(data), len(data) != t.nbytes or get_codec(t.dtype).all_finite(data, t.shape)
    codec = get_codec(t.dtype)
    piece_bytes = max(1, PIECE_BYTES // codec.type_size) * codec.type_size  # whole blocks
    hasher, size, finite = dg.hasher(), 0, True
    for piece in t.pieces(piece_bytes):
        size += len(piece)
        hasher.update(piece)
        if finite and len(piece) % codec.type_size == 0:
            finite = codec.all_finite(piece, (len(piece) // codec.type_size * codec.block_size,))
    return dg.PREFIX + hasher.hexdigest(), size, finite


def _check_source_unchanged(source: BaseSource, staging) -> None:
    """A tensor streamed from its file was hashed, then copied: once the copies are written,
    the file must still hold what was hashed, or what was staged may not be what its digest
    names. Written since it was opened: refused. Not provably unchanged (it changed just
    before it was opened): staged, but not recorded as verified (the first activation
    re-hashes it, as it re-hashes any blob it has no record of)."""
    staging.flush()
    unchanged = source.unchanged()
    if unchanged is False:
        raise InvalidInput("the file was written to while it was imported; nothing was stored "
                           "(import it again once it is complete)")
    if unchanged:
        staging.copies_checked()


def _prefetched(pool: ThreadPoolExecutor, fn, items: list):
    """fn(item) for each item in order, computed on `pool` at most PREFETCH items ahead."""
    pending = deque(pool.submit(fn, item) for item in items[:PREFETCH])
    for nxt in items[PREFETCH:]:
        pending.append(pool.submit(fn, nxt))
        yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def open_adapter_source(path: Path, base_shapes: dict[str, tuple[int, ...]] | None = None) -> AdapterSource:
    """The adapter at `path`. `base_shapes` (the shapes of the base it is meant for) settles
    what a PEFT file leaves open (an IA3 vector's other side, SHiRA's column count) instead of
    inferring it from the adapter alone."""
    if not path.exists():
        raise NotFound(f"no such file or directory: {path}")
    if path.is_dir():
        if is_peft_dir(path):
            return read_peft_adapter(path, base_shapes)
        raise InvalidInput(f"{path}: not a PEFT adapter directory (no adapter_config.json)")
    if is_gguf_lora(path):
        return read_gguf_lora(path)
    raise InvalidInput(f"{path.name}: not a PEFT adapter directory or a GGUF LoRA file")


def import_adapter(store: StoreDir, path: Path, name: str, progress: Progress | None = None,
                   base: str | None = None) -> ImportResult:
    """Import an adapter; with `base` (a base's name or digest) its shapes come from that base
    and it is checked to fit it (as an activation would) before anything is stored."""
    progress = progress or NoProgress()
    _check_name_free(store, "adapter", name)
    started = time.perf_counter()
    base_manifest = load_base(store, base)[1] if base is not None else None
    shapes = None if base_manifest is None else {t.name: t.shape for t in base_manifest.tensors}
    source = open_adapter_source(Path(path), shapes)
    # staged without the store lock; _commit_named takes it to commit
    staging = store.objects.staging()
    try:
        manifest = stage_adapter(staging, source, str(path), progress)
        targets = manifest.targets
        if base_manifest is not None:
            check_adapter_fits(f"{path} (for base {base})", manifest, base_manifest, shapes)
        digest, new, previous = _commit_named(store, staging, "adapter", name, manifest.to_bytes())
    finally:
        staging.discard()
    return _result(store, "adapter", name, digest, source.format, sum(len(t.tensors) for t in targets),
                   {source.kind: len(targets)}, manifest.total_bytes, new, previous, started)


def _result(store: StoreDir, kind: str, name: str, digest: str, source_format: str, tensors: int,
            dtype_counts: dict, total_bytes: int, new: list[str], previous: str | None,
            started: float) -> ImportResult:
    """What an import reports: what it read, and the blobs it added to the store."""
    return ImportResult(kind=kind, name=name, digest=digest, source_format=source_format, tensors=tensors,
                        dtype_counts=dtype_counts, total_bytes=total_bytes, new_blobs=len(new),
                        new_bytes=sum(store.objects.size(d) for d in new),
                        seconds=round(time.perf_counter() - started, 3), previous=previous)


def stage_adapter(staging, source: AdapterSource, label: str, progress: Progress) -> AdapterManifest:
    """Stage an adapter's tensors (not its manifest) into `staging`; its manifest."""
    targets = []
    progress.start("importing adapter", len(source.targets))
    for t in sorted(source.targets, key=lambda t: t.module):
        refs = {}
        for key, arr in t.tensors.items():
            if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
                raise InvalidInput(f"{label}: tensor {key} of {t.module} has non-finite values")
            dtype, raw = tensor_bytes(arr)
            refs[key] = TensorRef(staging.put(raw), dtype, tuple(arr.shape))
        targets.append(TargetRecord(t.module, t.out_features, t.in_features,
                                    float(t.scale), refs, t.rank, t.ia3_on))
        progress.advance(1)
    progress.finish()
    return AdapterManifest(source.kind, source.format, source.row_layout, dict(source.requires), tuple(targets))
