"""Printers of the distribution verbs (export, import bundle, push, pull, sign, verify
--signature). Kept beside slm/render.py, whose helpers they use."""

from __future__ import annotations

from slm import render
from slm.render import human_bytes, sanitized
from slm.store import digest as dg


@sanitized(markup=False)
def exported(r: dict) -> None:
    if r["format"] == "slm":
        print(f"exported composition {r['composition_id']} to {r['path']}")
        print(f"  {r['blobs']} blobs, {human_bytes(r['bytes'])}; manifest {r['manifest_digest']}")
    elif r["format"] == "gguf":
        how = "the file it was imported from" if r["exact"] else "converted from its Hugging Face weights"
        print(f"exported base {dg.short(r['base'])} as gguf to {r['path']} ({how})")
        print(f"  {human_bytes(r['bytes'])}, sha256:{r['sha256']}")
    else:
        print(f"exported adapter {r['adapter']} as {r['format']} to {r['path']}")
        extra = f" (apply it with scale {r['weight']:g}, its weight in the composition)" if r["weight"] != 1.0 else ""
        print(f"  for base {dg.short(r['base'])}{extra}")


@sanitized(markup=False)
def received(r: dict) -> None:
    print(f"received composition {r['composition_id']} from {r['source']}")
    names = ", ".join(filter(None, [r["base_name"], *r["adapter_names"]]))
    print(f"  {r['blobs_downloaded']} blobs downloaded ({human_bytes(r['bytes_downloaded'])}), "
          f"{r['blobs_reused']} already stored; names: {names or '-'}; signatures: {r['signatures']}"
          + (f"; certificates: {r['certificates']}" if r["certificates"] else ""))
    print(f"  activate it with: slm activate {dg.short(r['composition_id'])}")


@sanitized(markup=False)
def pushed(r: dict) -> None:
    print(f"pushed composition {r['composition_id']} to {r['reference']}")
    print(f"  {r['blobs_uploaded']} blobs uploaded ({human_bytes(r['bytes_uploaded'])}), "
          f"{r['blobs_present']} already there; manifest {r['manifest_digest']}"
          + (f"; {r['referrers']} signature referrer(s)" if r["referrers"] else "")
          + (f"; {r['certificate_referrers']} certificate referrer(s)" if r["certificate_referrers"] else ""))


@sanitized(markup=False)
def signed(r: dict) -> None:
    if r.get("format") == "oms":
        oms_signed(r)
        return
    if "tag" in r:  # a statement for a tag
        print(f"{'signed' if r['added'] else 'already signed:'} composition {r['composition_id']} is version "
              f"{r['version']} of {r['repository']}:{r['tag']} until {r['expires']}")
    else:
        print(f"{'signed' if r['added'] else 'already signed by this key:'} composition {r['composition_id']}")
    print(f"  key {r['fingerprint']} ({r['public_key']}); {r['signatures']} signature(s)")


def oms_signed(r: dict) -> None:
    print(f"signed {r['files']} file(s) of {r['directory']} (OpenSSF Model Signing v1) into {r['path']}")
    print(f"  key {r['fingerprint']} ({r['public_key']})")


@sanitized(markup=False)
def signature_report(r: dict) -> None:
    print(f"composition {r['composition_id']}: {len(r['signatures'])} signature(s), "
          f"{r['trusted_keys']} trusted key(s)")
    for s in r["signatures"]:
        state = "valid, trusted" if s["valid"] and s["trusted"] else "valid, untrusted" if s["valid"] else "INVALID"
        print(f"  {dg.short(s['digest'])}  key {s['fingerprint'] or '-'}  {state}" +
              (f"  ({s['problem']})" if s["problem"] else ""))
    print("ok" if r["ok"] else "FAILED: no valid signature from a trusted key")


def verify_result(result) -> None:
    """`slm verify` in its three forms: a signature report, a certified report, a plain report."""
    r = result.to_json()
    if "trusted_keys" in r:
        signature_report(r)
        return
    render.verify_report(r)
    if "certificate" in r:
        print(f"certificate written to {render.printable(r['certificate'])}")
        print(f"  recorded with composition {dg.short(r['composition'])} as {dg.short(r['recorded'])}: it travels "
              "with export and push, and `slm health` checks it" if r["recorded"] else
              f"  not recorded with the composition: {r['not_recorded']}")


def provisioned(r) -> str:
    """`slm serve --model`: one log line (the server's log writes it, on stderr or as JSON)."""
    got = r.received
    how = ("pulled before under this digest: the registry was not asked" if got is None else
           f"{got.blobs_downloaded} blobs downloaded ({human_bytes(got.bytes_downloaded)}), "
           f"{got.blobs_reused} already stored")
    state = "activated" if r.transition.changed else "already active"
    return f"model {r.reference}: composition {r.composition_id} {state}; {how}"


def health_report(report) -> None:
    """`slm health`: one line per check that ran, then the verdict."""
    for c in report.checks:
        print(f"{c.status:<8} {render.printable(c.name):<24} {render.printable(c.reason)} ({c.duration_s:.2f} s)")
    print(f"composition {report.composition}: {'healthy' if report.healthy else 'unhealthy'}")


@sanitized(markup=False)
def follow_round(r: dict) -> None:
    """`slm follow`: one line per round (a trial's checks under it)."""
    active = dg.short(r["composition"]) if r["composition"] else "nothing"
    print(f"{r['outcome']}: {r['message']} (active: {active})", flush=True)
    for c in (r["health"] or {}).get("checks", []):
        print(f"  {c['status']:<8} {c['name']:<24} {c['reason']}", flush=True)


@sanitized(markup=False)
def follow_status(r: dict) -> None:
    if r["reference"] is None:
        print("this store follows no tag")
        return
    print(f"following {r['reference']}" + (" (a follower runs)" if r["following"] else " (no follower runs)"))
    print(f"  active:  {dg.short(r['active']) if r['active'] else '-'}")
    good = r["good"]
    print(f"  good:    " + (f"version {good['version']} {dg.short(good['composition'])}" if good else "-"))
    trial = r["trial"]
    if trial:
        print(f"  trial:   version {trial['version']} {dg.short(trial['composition'])} "
              f"(deaths {trial['deaths']}" + (f"; failed: {trial['failed']})" if trial["failed"] else ")"))
    for b in r["bad"]:
        print(f"  bad:     version {b['version']} {dg.short(b['composition'])} {b['manifest'][:19]}: {b['reason']}")
    if r["last_check"]:
        print(f"  last check {r['last_check']}: {r['last_outcome']}"
              + (f" (exit {r['last_exit_code']}: {r['last_error']})" if r["last_error"] else ""))
    if r["next_try"]:
        print(f"  next try {r['next_try']}" + (f" ({r['failures']} failure(s) in a row)" if r["failures"] else ""))


@sanitized(markup=False)
def follow_done(r: dict) -> None:
    """`slm follow --clear-bad` / `--forget`."""
    print(f"cleared {r['cleared']} bad mark(s)" if "cleared" in r else "forgot the followed tag")
