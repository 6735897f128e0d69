"""The results of signatures: sign, verify --signature, verify --certificate (what every
result shares: slm.ops.results)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slm.ops.results import Result
from slm.ops.results.integrity import VerifyReport


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
class StatementResult(SignResult):
    """`slm sign --for REPO:TAG --version N --expires DURATION`: a signed statement for a tag,
    stored with the composition's signatures (slm.distribution.statement)."""

    repository: str
    tag: str
    version: int
    expires: str


@dataclass(frozen=True)
class OmsSignResult(Result):
    """`slm sign --format oms --out SIG DIR`: an OpenSSF Model Signing signature of a directory."""

    format: str
    path: str
    directory: str
    files: int
    public_key: str
    fingerprint: str


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
    recorded: str | None = None  # its blob's digest, when it is recorded with the stored composition
    not_recorded: str = ""  # why it is not

    def to_json(self) -> dict[str, Any]:
        return {**self.report.to_json(), "certificate": self.certificate, "recorded": self.recorded,
                "not_recorded": self.not_recorded}

    def check(self) -> None:
        self.report.check()
