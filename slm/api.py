"""The public Python API (the seed's runtime boundary): what `import slm` offers.

    store = slm.Store.init(path); store.import_base("model.gguf", name="smol")
    comp = store.compose("smol", ["french@0.8"])  # -> Composition (pure: writes nothing)
    store.activate(comp); s = slm.Runtime(store).session(comp)  # or .session("smol+french@0.8")
    s.generate("Once upon a time", max_tokens=32)  # -> Generation

Every method is one operation of slm.ops; the CLI is a printer over these same calls, and
`slm serve` is built on them too (Runtime.stage/switch/scheduler: docs/api.md, "Serving"). Results
are frozen dataclasses derived from slm.Result, all defined in slm.ops.results; errors are
slm.errors.SlmError subclasses, each with the exit code the CLI would use.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from slm.compose.composition import Composition
from slm.errors import UsageError
from slm.api_arguments import checked
from slm.api_session import Session  # noqa: F401  (Runtime.session's result, public as slm.Session)
from slm.api_follow import StoreFollow
from slm.api_names import StoreNames
from slm.store import store as _store
from slm.store.digest import short as short_digest, short_pair as short_digest_pair  # noqa: F401  (ids in messages)

# Each method imports the operation it runs: `slm activate` (a new process each time) must not
# pay for the importer, the executor, the tokenizer or the distribution code it does not use.
if TYPE_CHECKING:
    from slm.model.tokenizer import TextTokenizer
    from slm.ops.infer.loading import Loaded
    from slm.ops.progress import Progress
    from slm.engine.handle import DoneEvent, Event, FailedEvent, Handle, SchedulerStatus, TextEvent  # noqa: F401
    from slm.engine.request import ChatMessage, GenerationRequest, ResponseFormat, ToolCall, Tools  # noqa: F401
    from slm.ops.results import (AdapterExportResult, BaseExportResult, Certified, OmsSignResult, CompositionInfo, ExportResult, FsckReport, GcPlan,
                                 Generation, HealthReport, ImportResult, LogEntry, Provisioned, PushResult,
                                 ReceiveResult, SignatureReport,
                                 SignResult, StatementResult, Status, Transition, VerifyReport)
    from slm.ops.infer.run import RunOptions
    from slm.engine.scheduler import Scheduler

# What a Scheduler runs and gives back (slm serve builds them), each loaded on first use (PEP 562:
# `slm activate` needs none of these dataclasses)
_ENGINE_TYPES = {**dict.fromkeys(("ChatMessage", "GenerationRequest", "ResponseFormat", "ToolCall", "Tools"),
                                 "slm.engine.request"),
                 **dict.fromkeys(("Handle", "Event", "TextEvent", "DoneEvent", "FailedEvent", "SchedulerStatus"),
                                 "slm.engine.handle")}


def __getattr__(name: str):
    module = _ENGINE_TYPES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


@checked
class Store(StoreNames, StoreFollow):
    """A store of bases, adapters and compositions, and the one active composition (its names'
    verbs, tag/rm/mv/name_log, are StoreNames')."""

    def __init__(self, inner: _store.StoreDir) -> None:
        self._s = inner

    created: bool = False  # set by init: whether this call created the store

    @classmethod
    def init(cls, path: str | os.PathLike | None = None) -> "Store":
        """Create a store at `path`, else $SLM_STORE, else ./.slm (idempotent: an existing
        store is opened; `.created` tells which)."""
        inner, created = _store.init_store(_store.default_init_path(path))
        store = cls(inner)
        store.created = created
        return store

    @classmethod
    def open(cls, path: str | os.PathLike | None = None, check_config: bool = True) -> "Store":
        """The store at `path`, else $SLM_STORE, else .slm found upward from the working directory.
        Its config.toml is checked (an unknown or misplaced key is InvalidInput); check_config=False
        opens a store whose config.toml is damaged, for `fsck()` to report it."""
        return cls(_store.StoreDir.open(_store.find_store(path), check_config))

    @property
    def root(self) -> Path:
        return self._s.root

    @property
    def active_ref_path(self) -> Path:
        """The file refs/active: a process that follows switches by others (slm serve) watches
        its bytes change; `active()` reads what it names."""
        return self._s.active_ref.path

    # -- import ----------------------------------------------------------------------------
    def import_base(self, path: str | os.PathLike, name: str, quant: str | None = None,
                    progress: Progress | None = None) -> ImportResult:
        from slm.ops.store import importing

        return importing.import_base(self._s, Path(path), name, quant, progress)

    def import_adapter(self, path: str | os.PathLike, name: str, progress: Progress | None = None,
                       base: str | None = None) -> ImportResult:
        """Import a PEFT adapter directory or a GGUF LoRA. With `base` (a stored base's name or
        digest), the adapter's shapes are taken from that base and it must fit it."""
        from slm.ops.store import importing

        return importing.import_adapter(self._s, Path(path), name, progress, base)

    # -- compositions and the active one ---------------------------------------------------
    def compose(self, base: str, adapters: Sequence[str] = ()) -> Composition:
        """A composition from a base and "NAME[@WEIGHT]" specs in load order; writes nothing."""
        from slm.ops.infer import compositions

        return compositions.build(self._s, base, list(adapters))

    def composition(self, spec: str) -> Composition:
        """The composition any spec names (docs/cli.md, "Composition specs"): a tag, a base,
        "BASE+ADAPTER@W+...", an id or unique prefix, "@active", "@active~N", a pulled
        "HOST/repo:tag". Writes nothing (a composed one is not stored)."""
        from slm.ops.store import specs

        return specs.resolve(self._s, spec)

    def activate(self, comp: Composition | str | None = None, adapters: Sequence[str] = (), *,
                 file: str | os.PathLike | None = None, memory_budget: str | None = None,
                 upgrade: bool = False) -> Transition:
        """Validate a composition (every blob re-hashed) and make it the active one, atomically.

        `comp` is a Composition, or a base name with `adapters` ("NAME[@WEIGHT]" in load
        order); or `file` names a composition manifest (TOML), as `slm activate -f`. With
        `upgrade`, `comp` is at most a composition id (default: the active one), rebuilt for
        this runtime as `upgrade()` does (`slm activate --upgrade`)."""
        from slm.ops.store import activation

        if upgrade:
            if adapters or file is not None:
                raise UsageError("--upgrade takes at most one composition id, no adapters or -f")
            return self.upgrade(comp, memory_budget=memory_budget)
        if isinstance(comp, Composition):
            if adapters or file is not None:
                raise UsageError("give a Composition alone, or a base with adapters, or a file")
            return activation.switch(self._s, comp, "activate", memory_budget)
        return activation.activate(self._s, comp, list(adapters), None if file is None else Path(file),
                                   memory_budget)

    def upgrade(self, comp: Composition | str | None = None, memory_budget: str | None = None) -> Transition:
        """Rebuild a composition (default: the active one) for this runtime version, verify it
        against the oracle, and make it active (docs/concepts.md, "Runtime upgrades")."""
        from slm.ops.store.upgrade import upgrade

        ref = comp.id if isinstance(comp, Composition) else comp
        return upgrade(self._s, ref, memory_budget)

    def deactivate(self, adapter: str) -> Transition:
        from slm.ops.store import activation

        return activation.deactivate(self._s, adapter)

    def rollback(self, steps: int | None = None, to: str | None = None) -> Transition:
        from slm.ops.store import activation

        return activation.rollback(self._s, steps, to)

    def status(self) -> Status:
        from slm.ops.store import activation

        return activation.status(self._s)

    def log(self) -> list[LogEntry]:
        """Every transition of the active composition, newest first."""
        from slm.ops.store import activation

        return activation.log(self._s)

    def active(self) -> Composition | None:
        from slm.ops.store import activation

        return activation.active(self._s)

    # -- inspection --------------------------------------------------------------------------
    def tokenizer(self, base: str) -> TextTokenizer:
        """The tokenizer of a base (query_tokenizer_info): encode, decode, special tokens."""
        from slm.model.tokenizer import load_tokenizer
        from slm.ops.store.resolve import load_base

        _, manifest = load_base(self._s, base)
        return load_tokenizer(self._s.objects.read_verified(manifest.tokenizer_digest))

    def ls(self) -> list[dict]:
        from slm.ops.store import inspect

        return inspect.list_entries(self._s)

    def show(self, ref: str) -> dict:
        from slm.ops.store import inspect

        return inspect.show(self._s, ref)

    # -- integrity -----------------------------------------------------------------------------
    def verify(self, comp: Composition | str | None = None, numerics: bool = True,
               progress: Progress | None = None) -> VerifyReport:
        from slm.ops.infer import verify

        ref = comp.id if isinstance(comp, Composition) else comp
        return verify.verify(self._s, ref, numerics, progress)

    def health(self, comp: Composition | str | None = None, *, certificate: str | os.PathLike | None = None,
               timeout_s: float = 60.0) -> HealthReport:
        """The health checks of a composition (default: the active one), stopped at the first
        failure: integrity, its signed verify certificate (the file given, else every one recorded
        with it), a short generation, the store's health.d/ scripts (each killed after
        timeout_s). Writes nothing (docs/health.md)."""
        from slm.ops.infer import health
        from slm.ops.store import specs

        resolved = comp if isinstance(comp, Composition) else specs.resolve(
            self._s, comp, hint="name a composition to check, or activate one")
        return health.check_health(self._s, resolved, certificate=None if certificate is None else Path(certificate),
                                   timeout_s=timeout_s)

    def fsck(self, repair: bool = False, progress: Progress | None = None) -> FsckReport:
        from slm.ops.store import fsck

        return fsck.fsck(self._s, repair, progress)

    def gc(self, dry_run: bool = False, on_plan: Callable[[GcPlan], None] | None = None,
           prune_now: bool = False) -> GcPlan:
        """Remove what nothing reaches: kept are every name, every name's reflog entry newer than
        config.toml's gc.reflog_expiry (prune_now: none of them), refs/active and its reflog."""
        from slm.ops.store import gc

        return gc.gc(self._s, dry_run, on_plan, prune_now)

    # -- distribution (docs/distribution.md) ---------------------------------------------------
    def export(self, ref: Composition | str | None, out: str | os.PathLike, format: str = "slm",
               base: str | None = None, tag: str | None = None,
               progress: Progress | None = None) -> ExportResult | AdapterExportResult | BaseExportResult:
        """A composition (a stored one, or a spec) as an OCI image layout ("slm"), a base as its
        GGUF file ("gguf"), or one LoRA adapter for llama.cpp ("gguf-lora") or PEFT ("peft").
        Writes files only."""
        from slm.ops.ship import exporting

        ref = ref.id if isinstance(ref, Composition) else ref
        return exporting.export(self._s, ref, Path(out), format, base, tag, progress)

    def import_bundle(self, path: str | os.PathLike, tag: str | None = None,
                      progress: Progress | None = None) -> ReceiveResult:
        """Receive an OCI image layout (directory or tar): every byte re-hashed, one transaction."""
        from slm.ops.ship import bundles

        return bundles.import_bundle(self._s, Path(path), tag, progress)

    def push(self, reference: str, comp: Composition | str | None = None, insecure: bool = False,
             progress: Progress | None = None, as_format: str = "slm") -> PushResult:
        """Upload a composition (default: the active one) to host[:port]/repo[:tag]: as slm's own
        bundle, or (`as_format` "modelpack" / "docker") as a model artifact of GGUF files."""
        from slm.ops.ship import registry_ops

        ref = comp.id if isinstance(comp, Composition) else comp
        return registry_ops.push(self._s, reference, ref, insecure, progress, as_format)

    def pull(self, reference: str, insecure: bool = False, progress: Progress | None = None) -> ReceiveResult:
        """Receive a composition from host[:port]/repo[:tag|@sha256:..]; only missing blobs move."""
        from slm.ops.ship import registry_ops

        return registry_ops.pull(self._s, reference, insecure, progress)

    def provision(self, reference: str, insecure: bool = False, memory_budget: str | None = None,
                  progress: Progress | None = None) -> Provisioned:
        """Pull a registry reference and activate it, as `slm pull` then `slm activate` (`slm serve
        --model`): a digest the store already received under that reference is not asked of the
        registry again; a tag is resolved again each time."""
        from slm.ops.ship import provision

        return provision.provision(self._s, reference, insecure, memory_budget, progress)

    def sign(self, comp: Composition | str | None, key: str | os.PathLike | None = None, format: str = "slm",
             out: str | os.PathLike | None = None, signature: str | os.PathLike | None = None,
             certificate: str | os.PathLike | None = None, chain: Sequence[str] = (),
             for_tag: str | None = None, version: int | None = None,
             expires: str | None = None) -> SignResult | OmsSignResult | StatementResult:
        """Sign a stored composition (default: the active one) with an Ed25519 PEM key; format
        "oms": OpenSSF Model Signing of the directory `comp` names (slm.ops.ship.oms_signing).
        `for_tag` REPO:TAG, `version` and `expires` (a duration: 30d) together: a signed statement
        for that tag (slm.distribution.statement)."""
        from slm.ops.ship import oms_signing

        ref = comp.id if isinstance(comp, Composition) else comp
        return oms_signing.sign_as_asked(self._s, ref, key, format, out, signature, certificate, chain,
                                         for_tag, version, expires)

    def verify_signatures(self, comp: Composition | str | None = None, keys: Sequence[str] = ()) -> SignatureReport:
        """Each signature of a composition checked; trusted = config.toml trusted_keys + `keys`."""
        from slm.ops.ship import signing

        ref = comp.id if isinstance(comp, Composition) else comp
        return signing.verify_signatures(self._s, ref, list(keys))

    def certify(self, comp: Composition | str | None, key: str | os.PathLike, out: str | os.PathLike,
                numerics: bool = True, progress: Progress | None = None) -> Certified:
        """verify, then write the report as a certificate signed with `key`, bound to the
        composition id; one that certifies passing numerics of a stored composition is also
        recorded with it (it travels with the composition; `health` checks it). Returns a
        Certified (the report, the path, the recorded digest or why it is not recorded)."""
        from slm.ops.ship import certificates

        ref = comp.id if isinstance(comp, Composition) else comp
        return certificates.certify(self._s, ref, Path(key), Path(out), numerics, progress)

    def verify_as_asked(self, comp: Composition | str | None = None, numerics: bool = True,
                        signature: bool = False, keys: Sequence[str] = (),
                        certificate: str | os.PathLike | None = None,
                        progress: Progress | None = None) -> SignatureReport | Certified | VerifyReport:
        """`slm verify`'s three forms and the rules of their arguments: the signatures alone
        (keys: extra trusted public keys), a certificate written with the one signing key in
        keys, or the plain verification (no keys)."""
        if signature:
            if certificate is not None:
                raise UsageError("--signature and --certificate are separate checks; give one")
            return self.verify_signatures(comp, keys)
        if certificate is not None:
            if len(keys) != 1:
                raise UsageError("--certificate needs exactly one --key (the signing key)")
            return self.certify(comp, keys[0], certificate, numerics, progress)
        if keys:
            raise UsageError("--key goes with --signature or --certificate")
        return self.verify(comp, numerics, progress)

    # -- the command line's run ----------------------------------------------------------------
    def run(self, options: RunOptions, on_text: Callable[[str], None] | None = None) -> Generation:
        """`slm run`: load the active composition (or options.base), generate, stop at a switch
        of refs/active unless options.on_switch is "finish"; --logits-out written on success."""
        from slm.ops.infer import run

        return run.run_prompt(self._s, options, on_text)


@checked
class Runtime:
    """Compositions staged in this process, sharing one memory map per base; sessions on them.

    Staging validates and re-hashes like an activation; switching between staged
    compositions is a reference swap. A Runtime never changes refs/active. A Runtime and its
    sessions may be shared by threads: each call gives what it gives alone (docs/api.md, Threads).
    """

    def __init__(self, store: Store, max_staged: int = 8, threads: int | None = None,
                 exact: bool = False, memory_budget: str | None = None) -> None:
        from slm.model import modes
        from slm.ops.infer import budget
        from slm.ops.infer.run import check_threads
        from slm.ops.infer.staging import StagedCompositions

        check_threads(threads)
        # the numerics mode, part of the runtime's identity: "int8" by default where the C
        # kernels have it, "exact" (float32 products) with exact=True (docs/numerics.md)
        self.mode: str = modes.resolve(exact)
        self.store = store
        self._rt = StagedCompositions(store._s, max_staged)
        self.max_staged = max_staged  # compositions kept staged (the least recently used beyond it let go)
        self.threads = threads
        # bytes, or None: `memory_budget` ("8G"), else config.toml's, as `slm activate` resolves it
        self.memory_budget: int | None = budget.resolve(store._s, memory_budget)

    def session(self, comp: Composition | str | None = None) -> "Session":
        """A session pinned to `comp` (a Composition, stored or not, or a spec: `stage`), or to the
        active one. Staged as `activate` checks it; refs/active is never touched."""
        return Session(self, self.stage("@active" if comp is None else comp), self.store._s)

    # -- for a long-running server (slm serve; docs/api.md, "Serving") --------------------------
    def stage(self, comp: Composition | str) -> Loaded:
        """Stage a composition (a Composition, stored or not; or any spec slm.ops.store.specs reads: a tag,
        an id or prefix, BASE+ADAPTER@W+..., @active~N, a pulled reference) as activating checks it
        (signature policy, memory budget), without making it current. The Loaded (`.id`, `.composition`) is what a Scheduler runs on."""
        from slm.ops.infer import budget
        from slm.ops.store import specs

        loaded = self._rt.stage(comp if isinstance(comp, Composition) else specs.resolve(self.store._s, comp))
        budget.check(budget.of_staged(loaded.staged, mode=self.mode), self.memory_budget, "this composition")
        return loaded

    def switch(self, comp: Composition | str) -> Loaded:
        """Stage a composition and make it this process's current one (kept staged while it is)."""
        return self._rt.switch(self.stage(comp).id)

    def staged(self) -> list[CompositionInfo]:
        """The compositions staged now, least recently used first."""
        from slm.ops.results import CompositionInfo

        return [CompositionInfo.of(comp) for comp in self._rt.compositions()]

    def memory_estimate(self, loaded: Loaded) -> dict[str, int]:
        """A staged composition's memory estimate (the one `slm activate` checks), as JSON."""
        from slm.ops.infer import budget

        return budget.of_staged(loaded.staged, mode=self.mode).to_json()

    def scheduler(self, max_batch: int = 8, max_queue: int = 32, prefill_chunk: int | None = None,
                  metrics: object | None = None, log: Callable[[str], None] = print) -> Scheduler:
        """The continuous-batching scheduler of slm serve, with this runtime's threads,
        numerics mode and memory budget: `submit(staged, request)` prepares a GenerationRequest
        on a staged composition and queues it (Busy when full, ShuttingDown once draining),
        returning a Handle whose typed events carry slm.TokenLogprobs (docs/api.md, "Serving")."""
        from slm.engine.scheduler import Scheduler
        from slm.model import modes
        from slm.ops.infer.run import logprob_view

        chunk = {} if prefill_chunk is None else {"prefill_chunk": prefill_chunk}
        return Scheduler(max_batch, max_queue, self.threads, self.memory_budget, metrics, log,
                         modes.activations_of(self.mode), view=logprob_view, **chunk)


def check_sampling(temperature: float, top_p: float, seed: int | None, max_temperature: float = math.inf) -> None:
    """The one check of sampling options (slm run's, the sessions', the server's; the server takes
    OpenAI's temperature range, 0 to 2): slm.engine.sampling.check_sampling's InvalidInput."""
    from slm.engine.sampling import check_sampling as check

    check(temperature, top_p, seed, max_temperature)


def check_threads(threads: int | None) -> None:
    """The check of a thread count (None: every core), as Runtime makes it: InvalidInput naming
    --threads (slm serve checks its options with it before anything slow)."""
    from slm.ops.infer.run import check_threads as check

    check(threads)


def check_processing(**options: object) -> None:
    """The check of the other options (top_k, min_p, penalties, logit_bias, logprobs, n, stop):
    slm.engine.sampling.check_processing's InvalidInput naming the option."""
    from slm.engine.sampling import check_processing as check

    check(**options)
