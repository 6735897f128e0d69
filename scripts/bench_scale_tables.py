"""The Markdown tables of docs/benchmarks.md "At deployment sizes", from the "scale" section of
docs/bench.json (written by scripts/bench_scale.py).

    python scripts/bench_scale_tables.py [docs/bench.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _ratio(a, b) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _num(x, digits: int = 1) -> str:
    return f"{x:.{digits}f}" if x is not None else "-"


def print_tables(results: dict) -> None:
    m = results["machine"]
    dates = sorted(r["date"] for r in results["models"].values() if "date" in r)
    print(f"{dates[0]} to {dates[-1]}; {m['cpu']} (family {m.get('cpu_family')}, model {m.get('model')}), "
          f"{m['cpus']} cores, {', '.join(m.get('isa', []))}; llama.cpp: {results['peer_build'].splitlines()[0]}")
    _import_table(results["models"])
    _throughput_tables({k: v for k, v in results["models"].items() if "tok_s" in v})
    _lora_table(results["models"])
    _http_table(results["models"])
    skipped = [f"{k} ({v['skipped']})" for k, v in results["models"].items() if "skipped" in v]
    if skipped:
        print(f"\nskipped: {', '.join(skipped)}")


def _throughput_tables(models: dict) -> None:
    """Decode, prefill, the share of the read bandwidth, the batched step: the models the
    worker measured (a run with --runs 0 takes only the LoRA, HTTP and import figures)."""
    if not models:
        return
    for op, title in (("decode", "decode tok/s"), ("prefill", "prefill tok/s")):
        print(f"\n| model (file) | slm {title} | slm int8 | llama-bench | slm / llama-bench | slm int8 / llama-bench "
              f"| runs x tokens | load |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in models.values():
            t, cfg = r["tok_s"], r.get("settings", {})
            s, q, ll = t.get(f"slm|{op}"), t.get(f"slm int8|{op}"), t.get(f"llama-bench|{op}")
            digits = 2 if op == "decode" else 1
            print(f"| {r['what']} | {_num(s, digits)} | {_num(q, digits)} | {_num(ll, digits)} | {_ratio(s, ll)} | "
                  f"{_ratio(q, ll)} | {cfg.get('runs', '?')} x {cfg.get(op, '?')} | {r['load_median']:.1f} |")
    print("\n| model (file) | weights read per token | read bandwidth (2 threads) | slm | slm int8 | llama-bench |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in models.values():
        share = r["bandwidth_share"]
        print(f"| {r['what']} | {r['streamed_bytes_per_token'] / 1e9:.2f} GB | "
              f"{r['tok_s']['read_bandwidth_gb_s']:.1f} GB/s | " +
              " | ".join(f"{100 * share[k]:.0f}%" if k in share else "-" for k in ("slm", "slm int8", "llama-bench"))
              + " |")
    print("\n| model (file) | slm 8 sequences, aggregate decode tok/s | slm int8 | slm int8, 8 on one LoRA "
          "| slm int8, 8 on 4 compositions | 8 on 4 / 8 on one | 8 on 4 / 8 on one LoRA | llama-batched-bench -npl 8 "
          "| slm / llama | slm int8 / llama |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in models.values():
        t = r["tok_s"]
        s, q, ll = t.get("slm|batch8"), t.get("slm int8|batch8"), t.get("llama-batched-bench|batch8")
        lora, four = t.get("slm int8|batch8 on one LoRA"), t.get("slm int8|batch8 on 4 compositions")
        if ll is None and s is None:
            continue
        # the medians of each round's ratios where the run has them (bench_scale's batch_ratios)
        ratios = r.get("batch_ratios", {})
        over_one = f"{ratios['four_over_one']:.2f}x" if ratios else _ratio(four, q)
        over_lora = f"{ratios['four_over_lora']:.2f}x" if ratios else _ratio(four, lora)
        print(f"| {r['what']} | {_num(s)} | {_num(q)} | {_num(lora)} | {_num(four)} | {over_one} | {over_lora} | "
              f"{_num(ll)} | {_ratio(s, ll)} | {_ratio(q, ll)} |")


def _table(models: dict, key: str, columns: list[str]) -> list[dict]:
    """The models that have `key`; when there are any, a table's head (the model column, then
    `columns`, all right-aligned but the first) printed for them."""
    rows = [r for r in models.values() if key in r]
    if rows:
        print("\n| model (file) | " + " | ".join(columns) + " |")
        print("|---|" + "---:|" * len(columns))
    return rows


def _import_table(models: dict) -> None:
    """`slm import base` of each file (scripts/bench_import.py): medians, and the disk's own
    sequential write bandwidth measured in the same run and directory."""
    for r in _table(models, "import", ["slm import base, MB/s", "MiB/s", "seconds", "CPU seconds", "peak RSS",
                                       "disk write, MB/s", "one stream", "import / disk", "imports", "load"]):
        i, disk = r["import"], r["import"]["disk_write"]
        loads = [s["load"] for s in i["samples"]]
        print(f"| {r['what']} | {i['mb_s']:.0f} | {i['mib_s']:.0f} | {i['median_seconds']:.2f} | "
              f"{i['median_cpu_s']:.2f} | {i['peak_rss_bytes'] / 2**20:.0f} MiB | {disk['mb_s']:.0f}"
              f"{'' if disk['direct'] else ' (page cache)'} | {_num(disk.get('one_stream_mb_s'), 0)} | "
              f"{100 * i['share_of_disk_write']:.0f}% | "
              f"{len(i['samples'])} | {sorted(loads)[len(loads) // 2]:.1f} |")


def _lora_table(models: dict) -> None:
    for r in _table(models, "lora_overhead_ab_int8", ["base ms/token", "LoRA r=16 ms/token", "overhead",
                                                      "lowest, highest", "base CPU ms/token", "LoRA CPU ms/token",
                                                      "CPU overhead", "tokens a side", "processes", "load"]):
        ab = r["lora_overhead_ab_int8"]
        # (runs before the A/B had processes of its own: one process, no range)
        spread = (f"{100 * ab['overhead_lowest']:+.1f}%, {100 * ab['overhead_highest']:+.1f}%"
                  if "processes" in ab else "-")
        print(f"| {r['what']} | {ab['base_ms_per_token']:.1f} | {ab['lora_ms_per_token']:.1f} | "
              f"{100 * ab['overhead']:+.1f}% | {spread} | {ab['base_cpu_ms_per_token']:.1f} | "
              f"{ab['lora_cpu_ms_per_token']:.1f} | {100 * ab['overhead_cpu']:+.1f}% | "
              f"{ab['blocks'] * ab['steps_per_block']} | {ab.get('processes', 1)} | {ab['load']:.1f} |")


def _http_table(models: dict) -> None:
    for r in _table(models, "http", ["slm serve, 8 concurrent requests, tok/s", "slm serve, 8 on 4 compositions",
                                     "8 on 4 / 8 on one", "llama-server -np 8", "slm / llama-server"]):
        t = r["http"]["tok_s"]
        s, four, ll = t.get("slm serve|http8"), t.get("slm serve|http8 on 4 compositions"), t.get("llama-server -np 8|http8")
        # the median of the ratios of samples taken side by side where the run kept them
        paired = r["http"].get("four_over_one")
        ratio = f"{paired:.2f}x" if paired is not None else _ratio(four, s)
        print(f"| {r['what']} | {_num(s)} | {_num(four)} | {ratio} | {_num(ll)} | {_ratio(s, ll)} |")


if __name__ == "__main__":
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent / "docs" / "bench.json"
    print_tables(json.loads(path.read_text())["scale"])
