"""Every typed result of the operations: what the public API returns and the CLI prints.

Each derives from `Result`, which owns `to_json()` (plain dicts and lists: what `--json`
prints); each is a frozen dataclass, so a result cannot be changed after the fact by whoever
holds it; each is exported from `slm` (docs/api.md, "Results and errors"). Built in one place
each: the operation that produced the facts. The module imports only the standard library, so
any layer from slm/ops up may build these without a cycle.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


class Result:
    """The base of every result: `to_json()` is the dataclass's fields as plain data."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]


# -- compositions and switches (activate, deactivate, rollback, upgrade, status, log) --------------
@dataclass(frozen=True)
class AdapterEntry(Result):
    name: str
    digest: str
    weight: float


@dataclass(frozen=True)
class CompositionInfo(Result):
    """A composition as the user sees it: its id, its base and its adapters in load order."""

    id: str
    base: str
    base_name: str
    adapters: tuple[AdapterEntry, ...]

    @classmethod
    def of(cls, comp: Any) -> CompositionInfo:
        """From a slm.compose.composition.Composition (the one place this view is built)."""
        return cls(comp.id, comp.base, comp.base_name,
                   tuple(AdapterEntry(a.name, a.digest, a.weight) for a in comp.adapters))


@dataclass(frozen=True)
class Transition(Result):
    """What activate / deactivate / rollback did."""

    changed: bool
    previous: str | None
    active: CompositionInfo
    memory_estimate: dict[str, Any] | None = None
    note: str = ""


@dataclass(frozen=True)
class Status(Result):
    active: CompositionInfo | None
    transitions: int
    torn_reflog_tail: bool
    interrupted_transaction: bool


@dataclass(frozen=True)
class LogEntry(Result):
    seq: int
    op: str
    old: str | None
    new: str | None  # None: a name's removal (`slm log NAME`)
    time: float


@dataclass(frozen=True)
class NameMove(Result):
    """A name moved (`slm tag`, `rm`, `mv`, an import under a taken name, a pull): from
    `old` to `new` (None: absent); `moved` False when it already pointed there."""

    kind: str
    name: str
    old: str | None
    new: str | None
    moved: bool
    op: str


# -- generation --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Timings(Result):
    prefill_s: float
    decode_s: float
    prefill_tok_s: float
    decode_tok_s: float


@dataclass(frozen=True)
class Alternative(Result):
    token: int
    text: str
    logprob: float


@dataclass(frozen=True)
class TokenLogprobs(Result):
    """One answer token's logprob (log-softmax of the model's logits at its position, before
    penalties, bias, temperature and filters) and the most likely alternatives there."""

    token: int
    text: str  # the token's text alone (a part of a character shows as U+FFFD)
    logprob: float
    top: tuple[Alternative, ...]


@dataclass(frozen=True)
class Generation(Result):
    """One generation: the text, the token ids, and the composition it ran on."""

    composition: str  # the composition id
    base: str
    adapters: tuple[AdapterEntry, ...]
    prefix_cache: str  # "hit" or "miss"
    prompt_tokens: tuple[int, ...]
    tokens: tuple[int, ...]
    text: str
    stop_reason: str  # "eos", "length", "context", "switched"
    timings: Timings
    mode: str  # what the numbers were computed in: "int8" or "exact" (slm.model.modes)
    logits_out: str | None = None
    memory_estimate: dict[str, Any] | None = None
    seed: int | None = None  # the sampler's seed: the one given, else the fresh random one drawn
    logprobs: tuple[TokenLogprobs, ...] | None = None  # each answer token's, when asked

    @property
    def composition_id(self) -> str:
        return self.composition

    def check(self) -> None:
        """`slm run` on the active composition stops at a switch unless told to finish: exit 11."""
        if self.stop_reason == "switched":
            from slm.errors import Switched

            raise Switched("the active composition changed during generation; stopped at a token "
                           "boundary (use --on-switch finish to complete on the pinned composition)")


# -- integrity: fsck, gc, verify -------------------------------------------------------------------
@dataclass(frozen=True)
class Finding(Result):
    problem: str  # a short kind: corrupt-blob, torn-reflog, interrupted, ...
    what: str  # which file or object, and what is wrong
    action: str = ""  # what --repair did (or would do)
    repaired: bool = False
    repairable: bool = True


@dataclass(frozen=True)
class FsckReport(Result):
    clean: bool
    repair: bool
    blobs_checked: int
    bytes_checked: int
    findings: tuple[Finding, ...]
    unresolved: int

    @property
    def exit_code(self) -> int:
        """0 clean (or all repaired), 9 an interrupted transaction --repair finishes, 5 damage."""
        unresolved = [f for f in self.findings if not f.repaired]
        if not unresolved:
            return 0
        if any(f.problem in ("torn-reflog", "interrupted", "ref-mismatch", "junk") and f.repairable
               for f in unresolved):
            return 9
        return 5

    def check(self) -> None:
        """Raise the error an unclean fsck exits with: NeedsRecovery (9) if `--repair` finishes
        what is left, else IntegrityError (5)."""
        from slm.errors import IntegrityError, NeedsRecovery

        code = self.exit_code
        if code == 0:
            return
        left = [f for f in self.findings if not f.repaired]
        what = f"{len(left)} problem(s) {'left after --repair' if self.repair else 'found'}"
        if code == 9:
            raise NeedsRecovery(f"fsck: {what}, e.g. {left[0].problem}: run `slm fsck --repair`")
        raise IntegrityError(f"fsck: {what}, e.g. {left[0].problem}: {left[0].what}")


@dataclass(frozen=True)
class GcPlan(Result):
    blobs: tuple[dict, ...]  # {"digest", "bytes"}
    composition_records: tuple[str, ...]
    cache_dirs: tuple[str, ...]
    bytes: int
    kept_blobs: int
    dry_run: bool = True
    reflog_expiry_s: float | None = None  # name-reflog entries older than this were not kept


@dataclass(frozen=True)
class VerifyReport(Result):
    """`slm verify`: every blob re-hashed, and (unless skipped) logits vs the float64 oracle."""

    composition: str
    base: str
    adapters: tuple[AdapterEntry, ...]
    integrity: dict[str, Any]  # blobs, bytes, bad_blobs, ok
    numerics: dict[str, Any] | None  # probes, positions, errors, tolerance, ok; None if skipped

    @property
    def ok(self) -> bool:
        return bool(self.integrity["ok"]) and (self.numerics is None or bool(self.numerics["ok"]))

    def check(self) -> None:
        """Raise the error a failed verify exits with: integrity (5) before numerics (10)."""
        from slm.errors import IntegrityError, NumericsError

        if not self.integrity["ok"]:
            bad = self.integrity["bad_blobs"]
            raise IntegrityError(f"verify failed: {len(bad)} blob(s) missing or corrupt, e.g. {bad[0]}")
        n = self.numerics
        if n is not None and not n["ok"]:
            raise NumericsError(
                f"verify failed: logits differ from the fresh-base oracle (max abs {n['max_abs_error']:.2e}, "
                f"mean {n['mean_abs_error']:.2e}, top-1 agreement {n['top1_agreement']:.3f})")


# -- import and distribution: import, export, import bundle, push, pull ----------------------------
@dataclass(frozen=True)
class ImportResult(Result):
    kind: str
    name: str
    digest: str
    source_format: str
    tensors: int
    dtype_counts: dict[str, int]
    total_bytes: int
    new_blobs: int
    new_bytes: int
    seconds: float
    warnings: list[str] = field(default_factory=list)
    previous: str | None = None  # the name pointed here before this import moved it


@dataclass(frozen=True)
class ExportResult(Result):
    """`slm export --format slm`: a composition written as an OCI image layout."""

    format: str
    path: str
    composition_id: str
    manifest_digest: str
    blobs: int
    bytes: int
    seconds: float


@dataclass(frozen=True)
class AdapterExportResult(Result):
    """`slm export --format gguf-lora|peft`: one adapter written for another runtime."""

    format: str
    path: str
    adapter: str
    base: str
    weight: float  # the composition's weight for it: give it to the consumer (llama.cpp's lora scale)
    details: dict
    seconds: float


@dataclass(frozen=True)
class ReceiveResult(Result):
    """`slm import bundle` and `slm pull`: a composition received, every byte re-hashed."""

    composition_id: str
    composition_manifest: str
    base_name: str
    adapter_names: tuple[str, ...]
    signatures: int
    layers: int
    blobs_downloaded: int
    bytes_downloaded: int
    blobs_reused: int
    new_blobs: int
    seconds: float
    source: str = ""
    manifest_digest: str = ""  # sha256 of the OCI manifest received

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "adapter_names": list(self.adapter_names)}


@dataclass(frozen=True)
class PushResult(Result):
    reference: str
    manifest_digest: str
    composition_id: str
    layers: int
    blobs_uploaded: int
    bytes_uploaded: int
    blobs_present: int
    referrers: int
    seconds: float


# -- signatures: sign, verify --signature, verify --certificate ------------------------------------
@dataclass(frozen=True)
class SignatureCheck(Result):
    digest: str
    public_key: str | None
    fingerprint: str | None
    valid: bool
    trusted: bool
    problem: str = ""


@dataclass(frozen=True)
class SignResult(Result):
    composition_id: str
    signature: str
    public_key: str
    fingerprint: str
    signatures: int
    added: bool


@dataclass(frozen=True)
class SignatureReport(Result):
    composition_id: str
    signatures: tuple[SignatureCheck, ...]
    trusted_keys: int

    @property
    def ok(self) -> bool:
        return any(c.valid and c.trusted for c in self.signatures)

    def to_json(self) -> dict[str, Any]:
        return {"composition_id": self.composition_id, "ok": self.ok, "trusted_keys": self.trusted_keys,
                "signatures": [c.to_json() for c in self.signatures]}

    def check(self) -> None:
        from slm.errors import IntegrityError
        from slm.store import digest as dg

        if not self.ok:
            what = "no signatures" if not self.signatures else "no signature from a trusted key verifies"
            raise IntegrityError(f"composition {dg.short(self.composition_id)}: {what}")


@dataclass(frozen=True)
class Certified(Result):
    """A verify report and the signed certificate written from it; its verdict is the report's."""

    report: VerifyReport
    certificate: str  # the certificate's path

    def to_json(self) -> dict[str, Any]:
        return {**self.report.to_json(), "certificate": self.certificate}

    def check(self) -> None:
        self.report.check()
