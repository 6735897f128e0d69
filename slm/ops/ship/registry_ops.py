"""`slm push` and `slm pull`: a composition to and from an OCI registry.

Push uploads only the blobs the registry lacks (HEAD first), then the manifest by its digest,
then one referrer manifest per signature and per signed verify certificate (`subject` = the
composition's manifest, artifactType that of its kind: slm.ops.ship.referrers; where the
registry does not index referrers itself, the OCI 1.1 fallback tag `sha256-<hex>` lists them),
and only then the manifest under its tag.
Pull is a receive transaction (slm.ops.ship.receive): only blobs the store lacks are downloaded,
each streamed into the store's tmp/ and hashed on the way (never held whole), every byte is
verified before anything becomes visible, kill -9 at any instant leaves old or new. A store
that requires signatures judges those that would come with the composition (its bundle's, its
referrers, its own) before anything is received (slm.ops.ship.policy.admit): a refused pull
writes nothing.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from slm.distribution import mediatypes as mt
from slm.distribution.bundle import MAX_MANIFEST_BYTES, Descriptor, Manifest, canonical, parse_manifest, sha256_of
from slm.distribution.reference import parse_reference
from slm.distribution.registry import Registry
from slm.errors import Incompatible, InvalidInput, NotFound
from slm.formats.jsonfile import parse_json_object
from slm.distribution import model_artifacts
from slm.ops.ship import bundles, certificates, model_pull, policy, receive, referrers
from slm.ops.infer import compositions
from slm.ops.store import naming
from slm.ops.progress import NoProgress, Progress
from slm.ops.results import PushResult, ReceiveResult
from slm.store import StoreDir

# Parallel HTTP connections: a registry answers each small blob after a round trip, so one
# connection at a time spends a push of hundreds of blobs waiting on the network.
WORKERS = 4


def push(store: StoreDir, reference: str, comp_ref: str | None = None, insecure: bool = False,
         progress: Progress | None = None, as_format: str = "slm") -> PushResult:
    """`as_format`: slm (slm's own bundle), or modelpack / docker (slm.ops.ship.model_push)."""
    if as_format != "slm":
        from slm.ops.ship import model_push

        return model_push.push_model(store, reference, comp_ref, as_format, insecure, progress)
    progress = progress or NoProgress()
    started = time.perf_counter()
    ref = parse_reference(reference)
    if ref.digest is not None:
        raise InvalidInput(f"{reference}: push to a tag (host/repo:tag), not a digest")
    plan = bundles.plan(store, comp_ref, progress)
    if ref.tag is None:
        ref = dataclasses.replace(ref, tag=bundles.default_tag(plan.composition))
    registry = Registry(ref, insecure)
    clients = _Clients(registry)
    advance_lock = threading.Lock()  # send() runs on the pool's threads
    try:
        blobs = [(plan.manifest.config.digest, len(plan.config), lambda: plan.config)]
        blobs += [(l.sha256, l.size, lambda l=l: plan.layer_bytes(l)) for l in plan.manifest.layers]
        progress.start("pushing", sum(size for _, size, _ in blobs))

        def send(blob) -> int:
            """Upload one blob unless the registry has it; the bytes sent."""
            digest, size, data_of = blob
            client = clients()
            sent = 0
            if not client.has_blob(digest):
                client.upload_blob(digest, data_of())
                sent = size
            with advance_lock:
                progress.advance(size)
            return sent

        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            results = list(pool.map(send, blobs))
        progress.finish()
        uploaded = sum(1 for r in results if r)
        sent = sum(results)
        present = len(results) - uploaded
        # by digest, then what refers to it, then the tag: whoever resolves the tag meanwhile
        # (a follower) finds the old manifest or the new one with its statements, never the new
        # one without them
        registry.put_manifest(plan.manifest_digest, plan.manifest_bytes)
        pushed = _push_referrers(registry, plan)
        registry.put_manifest(ref.tag, plan.manifest_bytes)
    finally:
        clients.close()
    return PushResult(str(ref), plan.manifest_digest, plan.composition.id, len(plan.manifest.layers),
                      uploaded, sent, present, pushed[referrers.SIGNATURE], round(time.perf_counter() - started, 3),
                      pushed[referrers.CERTIFICATE])


def _push_referrers(registry: Registry, plan: bundles.BundlePlan) -> dict[referrers.Kind, int]:
    """One referrer per signature and per certificate layer; how many of each kind."""
    subject = Descriptor(mt.OCI_MANIFEST, plan.manifest_digest, len(plan.manifest_bytes))
    pushed = []
    counts = dict.fromkeys(referrers.KINDS, 0)
    for layer in plan.manifest.layers:
        kind = referrers.KIND_OF_LAYER.get(layer.media_type)
        if kind is None:
            continue
        counts[kind] += 1
        referrer = Manifest(plan.manifest.config, (layer,), kind.artifact_type, subject).to_bytes()
        digest = sha256_of(referrer)
        resp = registry.put_manifest(digest, referrer)
        if "oci-subject" not in resp.headers:
            pushed.append({"mediaType": mt.OCI_MANIFEST, "digest": digest, "size": len(referrer),
                           "artifactType": kind.artifact_type})
    if pushed:  # the registry does not index referrers: maintain the fallback tag (OCI 1.1)
        tag = plan.manifest_digest.replace(":", "-")
        old = registry.get_manifest(tag, mt.OCI_INDEX)
        index = parse_json_object(old, f"the registry's referrers index {tag}", MAX_MANIFEST_BYTES) if old else {}
        entries = index.get("manifests", [])
        if not isinstance(entries, list):
            raise InvalidInput(f"the registry's referrers index {tag} has no list of manifests")
        known = {e.get("digest") for e in entries if isinstance(e, dict)}
        entries += [p for p in pushed if p["digest"] not in known]
        registry.put_manifest(tag, canonical({"schemaVersion": 2, "mediaType": mt.OCI_INDEX,
                                              "manifests": entries}), mt.OCI_INDEX)
    return counts


class _Clients:
    """One registry client (one HTTP connection) per thread, made on first use."""

    def __init__(self, first: Registry):
        self.first = first
        self.all = [first]
        self._local = threading.local()
        self._lock = threading.Lock()
        self._first_taken = False

    def __call__(self) -> Registry:
        client = getattr(self._local, "client", None)
        if client is None:
            with self._lock:
                if not self._first_taken:
                    client, self._first_taken = self.first, True
                else:
                    client = Registry(self.first.ref, self.first.insecure, self.first.credentials)
                    self.all.append(client)
            self._local.client = client
        return client

    def close(self) -> None:
        for client in self.all:
            client.close()


class _RegistrySource:
    """Blobs from a registry (receive.BlobSource): small ones whole, fetched ahead on WORKERS
    connections; the rest streamed, each GET's body read in pieces as it arrives."""

    workers = WORKERS

    def __init__(self, clients: _Clients):
        self.clients = clients

    def blob(self, digest: str, size: int) -> bytes:
        return self.clients().get_blob(digest, size)

    def chunks(self, digest: str, size: int):
        return self.clients().blob_chunks(digest, size)


def pull(store: StoreDir, reference: str, insecure: bool = False,
         progress: Progress | None = None) -> ReceiveResult:
    ref = parse_reference(reference)
    registry = Registry(ref, insecure)
    clients = _Clients(registry)
    try:
        data = registry.get_manifest(ref.ref)
        if data is None:
            raise NotFound(f"registry {ref.host}: no manifest {ref.repository}:{ref.ref}")
        artifact = _model_artifact(data, f"{ref} manifest")
        if artifact is not None:
            _refuse_unsigned_artifact(store, artifact, ref)
            pulled = model_pull.pull_model(store, artifact, data, _RegistrySource(clients), ref, progress)
            naming.name_remote(store, str(ref), compositions.load(store, pulled.composition_id))
            return pulled
        manifest = parse_manifest(data, f"{ref} manifest")
        # signatures and certificates pushed as referrers, checked before anything is received
        # (slm.ops.ship.referrers)
        referred = referrers.fetch_referrers(registry, manifest, sha256_of(data))
        signed = list(referred.signatures)
        # the store's signing policy over every signature that would come with the composition
        # (its own and the referrers), before anything is received: a refused pull writes nothing
        # an interrupted pull of this manifest keeps what it verified, for the next to resume
        result = receive.receive(store, manifest, _RegistrySource(clients), str(ref), progress,
                                 lambda comp_id, carried: policy.admit(store, comp_id, [*carried, *signed]),
                                 resume_key=sha256_of(data).removeprefix("sha256:"))
        added = referrers.adopt(store, result.composition_id, signed) if signed else 0
        certified = certificates.adopt(store, result.composition_id, list(referred.certificates)) \
            if referred.certificates else 0
    finally:
        clients.close()
    # the reference names what was received under it (`slm activate HOST/repo:tag`): a name
    # with a history like any other, moved by its own transaction once the composition is in
    naming.name_remote(store, str(ref), compositions.load(store, result.composition_id))
    return dataclasses.replace(result, manifest_digest=sha256_of(data), signatures=result.signatures + added,
                               referrer_signatures=len(signed), certificates=result.certificates + certified,
                               referrer_certificates=len(referred.certificates))


def _refuse_unsigned_artifact(store: StoreDir, artifact: model_artifacts.ModelArtifact, ref) -> None:
    """A model artifact carries no slm signature (slm pushes none with one, and its composition
    id is known only once its weights are imported), so a store that requires signatures
    refuses it before anything is downloaded."""
    if policy.policy(store).require_signed:
        raise Incompatible(f"{ref}: a {artifact.kind} model artifact carries no slm signature, and this store "
                           "requires signed compositions (require_signed in config.toml); push the composition "
                           "signed, in slm's own format")


def _model_artifact(data: bytes, what: str) -> model_artifacts.ModelArtifact | None:
    """The manifest read as a ModelPack or Docker model artifact, or None if it is neither
    (then it is read as slm's own, strictly)."""
    doc = parse_json_object(data, what, MAX_MANIFEST_BYTES)
    if model_artifacts.kind_of(doc) is None:
        return None
    return model_artifacts.parse_model_manifest(data, what)
