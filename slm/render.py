"""Presentation for the CLI: rich tables and progress on stderr, JSON on stdout."""

from __future__ import annotations

import datetime
import functools
import json
import sys
from functools import cache

from slm.errors import printable
from slm.store import digest as dg


@cache
def out():
    """The rich console on stdout, made on first use: importing rich is a noticeable share of
    start-up, which commands that print plain lines or JSON do not pay."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


@cache
def err():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def json_line(obj) -> str:
    """One JSON document on one line (a stream of results: `slm follow --json`)."""
    return json.dumps(obj.to_json() if hasattr(obj, "to_json") else obj, ensure_ascii=False) + "\n"


def _clean(obj, markup: bool):
    """Every string of a result made safe to print: control characters escaped (a name, a
    tensor name or a path from a hostile file cannot drive the terminal) and, for rich, markup
    brackets escaped (a name cannot restyle the output). Newlines of multi-line text stay.
    A typed result (slm.ops.results) is printed from its JSON form."""
    if hasattr(obj, "to_json"):
        obj = obj.to_json()
    if isinstance(obj, str):
        text = printable(obj, keep="\n")
        if markup:
            from rich.markup import escape

            text = escape(text)
        return text
    if isinstance(obj, dict):
        return {k: _clean(v, markup) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clean(v, markup) for v in obj)
    return obj


def sanitized(markup: bool = True):
    """Decorator: the printer receives its result with every string cleaned (see _clean)."""
    def wrap(printer):
        @functools.wraps(printer)
        def inner(result, *args, **kwargs):
            return printer(_clean(result, markup), *args, **kwargs)
        return inner
    return wrap


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _table():
    from rich.table import Table  # imported when a table is shown: start-up time of every command

    return Table(box=None, pad_edge=False)


class BarProgress:
    """Byte progress on stderr; silent when stderr is not a terminal (CI logs stay clean)."""

    def __init__(self, enabled: bool | None = None):
        self.enabled = err().is_terminal if enabled is None else enabled
        self._bar = None  # a rich Progress while a bar is shown
        self._task = None

    def start(self, description: str, total: int) -> None:
        if not self.enabled:
            return
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

        self._bar = Progress(
            "[progress.description]{task.description}", BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(), console=err(), transient=True,
        )
        self._bar.start()
        self._task = self._bar.add_task(description, total=total)

    def advance(self, amount: int) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, amount)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


@sanitized(markup=False)
def init_done(result: dict) -> None:
    verb = "created" if result["created"] else "already initialised:"
    print(f"{verb} store {result['store']}")


@sanitized(markup=True)
def import_summary(result: dict) -> None:
    types = ", ".join(f"{n} {t.upper()}" for t, n in result["dtype_counts"].items())
    out().print(
        f"imported {result['kind']} [bold]{result['name']}[/] {result['digest']}\n"
        f"  {result['tensors']} tensors ({types}), {human_bytes(result['total_bytes'])}; "
        f"{result['new_blobs']} new blobs ({human_bytes(result['new_bytes'])}) "
        f"in {result['seconds']:.2f}s"
    )
    if result.get("previous"):
        out().print(_moved(result["name"], result["previous"], result["digest"]))


def _moved(name: str, old: str | None, new: str | None) -> str:
    """`french: 1a2b3c -> 4d5e6f`: what a name pointed at, and now does."""
    before, after = dg.short_pair(old or "-", new or "-")
    return f"{name}: {before if old else '(none)'} -> {after if new else '(removed)'}"


@sanitized(markup=True)
def name_move(result: dict) -> None:
    label = {"base": "base", "adapter": "adapter", "tag": "tag", "remote": "pulled reference"}[result["kind"]]
    if not result["moved"]:
        out().print(f"{label} {_moved(result['name'], result['old'], result['new'])} (unchanged)")
    else:
        out().print(f"{label} {_moved(result['name'], result['old'], result['new'])}")


def name_moves(results: list[dict]) -> None:
    for result in results:
        name_move(result)


@sanitized(markup=True)
def entries_table(entries: list[dict]) -> None:
    if not entries:
        out().print("the store is empty; import a base with `slm import base PATH --name NAME`")
        return
    table = _table()
    for col in ("KIND", "NAME", "DIGEST", "NAMED", "DETAILS"):
        table.add_column(col)
    for e in entries:
        if "error" in e:
            details = f"[red]{e['error']}[/]"
        elif e["kind"] == "base":
            details = (f"{e['source_format']} {e['quant_profile']}, {e['tensors']} tensors, "
                       f"{human_bytes(e['bytes'])}")
        elif e["kind"] == "adapter":
            rank = f" r={e['rank']}" if e["rank"] else ""
            details = (f"{e['adapter_kind']}{rank} ({e['source_format']}), {e['targets']} targets, "
                       f"{human_bytes(e['bytes'])}")
        else:
            details = e["spec"] + ("  [bold](active)[/]" if e["active"] else "")
        table.add_row(e["kind"], e["name"], dg.short(e["digest"]) if e["digest"] else "-",
                      ", ".join(e.get("names", [])), details)
    out().print(table)


def manifest(info: dict) -> None:
    {"base": base_manifest, "adapter": adapter_manifest, "composition": composition}[info["kind"]](info)


@sanitized(markup=True)
def adapter_manifest(info: dict) -> None:
    out().print(f"[bold]adapter {info['name'] or info['digest']}[/]  {info['digest']}")
    out().print(f"  {info['adapter_kind']} from {info['source_format']}, rows {info['row_layout']}, "
              f"{len(info['targets'])} targets, {human_bytes(info['total_bytes'])}; requires {info['requires']}")
    table = _table()
    for col in ("TARGET", "SHAPE", "RANK", "SCALE", "IA3"):
        table.add_column(col)
    for t in info["targets"]:
        table.add_row(t["module"], "x".join(map(str, t["shape"])), str(t["rank"] or ""),
                      f"{t['scale']:g}", t["ia3_on"] or "")
    out().print(table)


@sanitized(markup=False)
def composition(info: dict) -> None:
    flag = "  [bold](active)[/]" if info["active"] else ""
    named = f"{info['name']}: " if info.get("name") else ""
    out().print(f"[bold]composition {named}{info['id']}[/]{flag}")
    out().print(info["manifest_toml"], markup=False)


@sanitized(markup=False)
def transition(result: dict) -> None:
    a = result["active"]
    stack = " + ".join([a["base_name"] or dg.short(a["base"]),
                        *(f"{x['name']}@{x['weight']:g}" for x in a["adapters"])])
    if not result["changed"]:
        note = result.get("note") or "already active; nothing changed"
        print(f"{note}: {stack} ({dg.short(a['id'])})")  # plain: names hold no markup
    else:
        print(f"active: {stack}\n  {a['id']}")


@sanitized(markup=False)
def status(info: dict) -> None:
    if info["active"] is None:
        out().print("nothing is active; run `slm activate BASE [ADAPTER[@WEIGHT]...]`")
    else:
        transition({"changed": True, "active": info["active"]})
        out().print(f"  spec {info['spec']}" + (f"; named {', '.join(info['names'])}" if info["names"] else ""))
    if info["interrupted_transaction"] or info["torn_reflog_tail"]:
        err().print("[red]an interrupted transaction needs `slm fsck --repair`[/]")


@sanitized(markup=True)
def reflog(entries: list[dict]) -> None:
    table = _table()
    for col in ("SEQ", "WHEN", "OP", "FROM", "TO"):
        table.add_column(col)
    for e in entries:
        when = datetime.datetime.fromtimestamp(e["time"]).strftime("%Y-%m-%d %H:%M:%S")
        ids = dg.short_pair(e["old"] or "-", e["new"] or "-")
        table.add_row(str(e["seq"]), when, e["op"], *(" ".join([i, *names]) for i, names in
                                                        zip(ids, (e["old_names"], e["names"]))))
    out().print(table)


@sanitized(markup=True)
def base_manifest(info: dict) -> None:
    a = info["architecture"]
    title = info["name"] or info["digest"]
    out().print(f"[bold]base {title}[/]  {info['digest']}")
    out().print(
        f"  {a['family']}: {a['num_layers']} layers, hidden {a['hidden_size']}, ffn "
        f"{a['intermediate_size']}, heads {a['num_heads']}/{a['num_kv_heads']} x {a['head_dim']}, "
        f"vocab {a['vocab_size']}, context {a['context_length']}, "
        f"{'tied' if a['tie_word_embeddings'] else 'untied'} head"
    )
    types = ", ".join(f"{n} {t.upper()}" for t, n in info["dtype_counts"].items())
    out().print(
        f"  source {info['source_format']}, profile {info['quant_profile']}, q/k rows "
        f"{info['qk_row_layout']}, tokenizer {dg.short(info['tokenizer']['digest'])}"
    )
    out().print(f"  {len(info['tensors'])} tensors ({types}), {human_bytes(info['total_bytes'])}")
    table = _table()
    for col in ("TENSOR", "SHAPE", "TYPE", "BYTES", "DIGEST"):
        table.add_column(col, justify="right" if col == "BYTES" else "left")
    for t in info["tensors"]:
        table.add_row(t["name"], "x".join(map(str, t["shape"])), t["dtype"].upper(),
                      str(t["nbytes"]), dg.short(t["digest"]))
    out().print(table)


def stream_text(piece: str) -> None:
    # generated text keeps its layout; any other control character (an ESC from a hostile
    # vocabulary) is shown escaped, never sent to the terminal
    sys.stdout.write(printable(piece, keep="\n\t"))
    sys.stdout.flush()


@sanitized(markup=False)
def version(info: dict) -> None:
    k = info["kernels"]
    if k["extension"] is None:
        kernels = "NumPy reference kernels (the C extension is not built)"
    else:
        built = "an unrecorded SIMD level (built before slm recorded it)" if k["built_for"] is None else \
            k["simd"] + (f" ({' '.join(k['built_for'])})" if k["built_for"] else "")
        kernels = f"C kernels, variant {k['variant']} of {' '.join(k['variants_built'])}, built for {built}" + \
            ("" if k["in_use"] else "; not in use (SLM_KERNELS=reference)")
    cpu = "unknown" if k["cpu"] is None else " ".join(k["cpu"]) or "none"
    if k["variants_built"]:
        cpu += f" (runs variants {' '.join(k['variants_runnable']) or 'none'})"
    print(f"slm {info['version']}\nruntime {info['runtime']['name']} {info['runtime']['version']}\n"
          f"kernels: {kernels}; this CPU: {cpu}; numerics mode: {info['mode']}")


class ChatPrinter:
    """`slm chat`'s view (slm.conversation.ChatView): answers on stdout as they stream, notices
    and errors on stderr, one line each."""

    prompt = ">>> "

    def read_line(self) -> str:
        """One line typed at the prompt (EOFError at the end of input). slm.conversation reads
        it on a thread of its own, which may still be waiting for a line when the chat ends:
        from a pipe, it is read below Python's buffered stdin, whose lock that thread would
        hold while the interpreter shuts down (a fatal error then)."""
        if sys.stdin.isatty():
            return input(self.prompt)
        sys.stdout.write(self.prompt)
        sys.stdout.flush()
        line = sys.stdin.buffer.raw.readline()
        if not line:
            raise EOFError
        return line.decode(sys.stdin.encoding or "utf-8", "replace").rstrip("\r\n")

    def text(self, piece: str) -> None:
        stream_text(piece)

    def answered(self, generation) -> None:
        sys.stdout.write("\n")
        sys.stdout.flush()
        if generation.stop_reason == "cancelled":
            print("(stopped)", file=sys.stderr, flush=True)
        if generation.prefix_cache == "damaged":
            damaged_cache_entry()

    def notice(self, message: str) -> None:
        print(printable(message), file=sys.stderr, flush=True)

    def prompt_again(self) -> None:
        sys.stderr.write(self.prompt)  # (where input() writes its prompt on a terminal)
        sys.stderr.flush()

    def error(self, message: str) -> None:
        print(f"slm: error: {printable(' '.join(message.split()))}", file=sys.stderr, flush=True)


def damaged_cache_entry() -> None:
    print("slm: warning: the prompt cache's entry for this prompt does not match the digest it was written "
          "with (damaged or altered): not used; `slm fsck --repair` removes such entries", file=sys.stderr, flush=True)


@sanitized(markup=True)
def run_footer(result: dict) -> None:
    sys.stdout.write("\n")
    t = result["timings"]
    prefill = ("prefix cache hit" if result["prefix_cache"] == "hit"
               else f"{t['prefill_tok_s']:.1f} tok/s")
    err().print(
        f"[dim]{len(result['prompt_tokens'])} prompt tokens ({prefill}), "
        f"{len(result['tokens'])} generated at {t['decode_tok_s']:.1f} tok/s "
        f"(stopped: {result['stop_reason']}, seed {result['seed']}; mode {result['mode']})[/]"
    )


@sanitized(markup=True)
def fsck_report(report: dict) -> None:
    checked = f"{report['blobs_checked']} blobs ({human_bytes(report['bytes_checked'])}) re-hashed"
    if report["clean"]:
        out().print(f"clean: {checked}")
        return
    for f in report["findings"]:
        if f["repaired"]:
            mark = f"[green]fixed[/]: {f['action']}"
        elif report["repair"] or not f["repairable"]:
            mark = "[red]cannot be repaired from inside the store[/]"
        else:
            mark = f"[yellow]`slm fsck --repair` will {f['action']}[/]"
        out().print(f"{f['problem']}: {f['what']} -- {mark}", highlight=False)
    out().print(f"{checked}; {len(report['findings'])} finding(s), {report['unresolved']} unresolved")


@sanitized(markup=True)
def gc_plan(plan: dict) -> None:
    out().print(
        f"plan: remove {len(plan['blobs'])} blobs ({human_bytes(plan['bytes'])}), "
        f"{len(plan['composition_records'])} composition records, "
        f"{len(plan['cache_dirs'])} prefix-cache folders, "
        f"{len(plan['pull_stagings'])} abandoned pull stagings; keep {plan['kept_blobs']} blobs"
    )
    if plan["active_log_expired"]:
        out().print(f"  expire the {plan['active_log_expired']} oldest entries of logs/active (kept: the newest "
                    f"{plan['active_log_keep']} and any newer than {plan['active_log_expiry_s'] / 86400:g} days)")
    for b in plan["blobs"][:20]:
        out().print(f"  blob {dg.short(b['digest'])}  {human_bytes(b['bytes'])}")
    if len(plan["blobs"]) > 20:
        out().print(f"  ... and {len(plan['blobs']) - 20} more")


@sanitized(markup=True)
def gc_done(result: dict) -> None:
    if result["dry_run"]:
        out().print("dry run: nothing removed")
    else:
        out().print(f"freed {len(result['blobs'])} blobs ({human_bytes(result['bytes'])}), "
                    f"{len(result['composition_records'])} composition records; expired "
                    f"{result['active_log_expired']} entries of logs/active")


@sanitized(markup=True)
def verify_report(report: dict) -> None:
    i = report["integrity"]
    mark = "[red]" + f"{len(i['bad_blobs'])} bad[/]" if i["bad_blobs"] else "[green]ok[/]"
    out().print(f"composition {report['composition']}")
    out().print(f"  integrity: {i['blobs']} blobs ({human_bytes(i['bytes'])}) re-hashed, {mark}")
    bad = i["bad_cache_entries"]
    mark = f"[red]{len(bad)} do not match their digest[/]" if bad else "[green]ok[/]"
    out().print(f"  prompt cache: {i['cache_entries']} entries checked, {mark}")
    n = report["numerics"]
    if n is not None:
        mark = "[green]ok[/]" if n["ok"] else "[red]FAILED[/]"
        t = n["tolerance"]
        out().print(
            f"  numerics vs fresh-base oracle ({n['probes']} probes, {n['positions']} positions): "
            f"max abs {n['max_abs_error']:.2e} (<= {t['max_abs']:g}), mean {n['mean_abs_error']:.2e} "
            f"(<= {t['mean_abs']:g}), top-1 {n['top1_agreement']:.3f}: {mark}"
        )
