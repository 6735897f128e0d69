"""The Markdown tables scripts/bench.py prints (docs/benchmarks.md quotes them)."""

from __future__ import annotations


def _fmt(x, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def print_tables(results: dict) -> None:
    print(f"CPU: {results['machine']['cpu']} ({results['machine']['cpus']} cores)")
    for base, r in results["bases"].items():
        print(f"\n### {base}\n")
        if "skipped" in r and "throughput_tok_s" not in r:
            print(f"skipped: {r['skipped']}")
            continue
        print_base_tables(r)


def print_base_tables(r: dict) -> None:
    for key, mode in (("batching", ""), ("batching_int8", " (int8 activations)")):
        if r.get(key):
            print_batching(r[key], r.get("batching_http") if key == "batching" else None, mode)
    if r.get("structured"):
        import bench_structured

        bench_structured.print_table("constrained decoding", r["structured"])
    if "throughput_tok_s" not in r:
        return
    print_throughput(r)


def print_batching(b: dict, h: dict | None, mode: str) -> None:
    if b:
        print(f"| decode (slm serve's batched step){mode} | aggregate tok/s | vs one request alone |")
        print("|---|---:|---:|")
        print(f"| one request, base | {b['one_base']:.1f} | 1.00 |")
        print(f"| one request, LoRA r=16 | {b['one_lora']:.1f} | {b['one_lora'] / b['one_base']:.2f} |")
        print(f"| 8 requests, base | {b['eight_base']:.1f} | {b['ratio_eight_base']:.2f} |")
        print(f"| 8 requests on 4 compositions (base + 3 LoRAs) | {b['eight_on_4_compositions']:.1f} | "
              f"{b['ratio_eight_on_4_compositions']:.2f} |")
        if h:
            print(f"| through `slm serve` (HTTP): one / 8 / 8 on 4 compositions | {h['one']:.1f} / {h['eight']:.1f} / "
                  f"{h['eight_on_4_compositions']:.1f} | {h['ratio_eight']:.2f} / "
                  f"{h['ratio_eight_on_4_compositions']:.2f} |")
        print()


def print_throughput(r: dict) -> None:
    t = r["throughput_tok_s"]
    names = sorted({k.split("|")[0] for k in t}, key=lambda n: (not n.startswith("slm"), n))
    ours = [n for n in names if n.startswith("slm")]
    print("| system | decode base | decode LoRA | prefill base | prefill LoRA | LoRA decode overhead |")
    print("|---|---:|---:|---:|---:|---:|")
    cells = (("decode", "base"), ("decode", "lora"), ("prefill", "base"), ("prefill", "lora"))
    for n in names:
        db, dl, pb, pl = (t.get(f"{n}|{w}|{k}") for k, w in cells)  # llama-bench: base only
        overhead = f"{100 * (db / dl - 1):.1f}%" if dl else "-"
        print(f"| {n} | {_fmt(db, 1)} | {_fmt(dl, 1)} | {_fmt(pb, 0)} | {_fmt(pl, 0)} | {overhead} |")
    print("\nslm's speed over each peer's (slm / peer; > 1 means slm is faster):\n")
    print("| slm mode / peer | decode base | decode LoRA | prefill base | prefill LoRA |")
    print("|---|---:|---:|---:|---:|")
    for mine in ours:
        for n in (n for n in names if n not in ours):
            ratios = [t[f"{mine}|{w}|{k}"] / t[f"{n}|{w}|{k}"] if f"{n}|{w}|{k}" in t else None for k, w in cells]
            print(f"| {mine} / {n} | " + " | ".join(_fmt(c, 2) for c in ratios) + " |")
    for key, mode in (("lora_overhead_ab", ""), ("lora_overhead_ab_int8", ", int8 activations")):
        ab = r.get(key)
        if ab:
            print(f"\nLoRA decode overhead{mode}, interleaved in-process A/B ({ab['blocks']} blocks of "
                  f"{ab['steps_per_block']} steps each, 20th percentile): {100 * ab['overhead']:.1f}% "
                  f"({ab['base_ms_per_token']:.2f} vs {ab['lora_ms_per_token']:.2f} ms per token)")
    for which, e in (r.get("int8_error") or {}).items():
        print(f"\nint8 activations vs float32, {which}, {e['positions']} positions one token at a time: "
              f"largest |logit difference| {e['max_abs_logit_diff']:.3f} (median {e['median_abs_logit_diff']:.3f}; "
              f"at most {100 * e['max_diff_over_spread']:.2f}% of the logits' spread), top token agrees at "
              f"{100 * e['top1_agreement']:.1f}% of positions, greedy text identical for "
              f"{e['greedy_tokens_identical']} of {e['greedy_tokens']} tokens")
    s = r["switch_s"]
    print(f"\nswitch: in-process warm {s['in_process_warm'] * 1e3:.3f} ms, in-process cold (stage the "
          f"adapter) {s['in_process_cold_adapter'] * 1e3:.1f} ms, `slm activate` wall "
          f"{s['slm_activate_wall'] * 1e3:.0f} ms")
    rss, est = r["peak_rss_bytes"], r["memory_estimate_bytes"]
    imp = r.get("import")
    if imp:  # median of the imports (scripts/bench_import.py), beside the disk's write bandwidth
        print(f"\nimport: {imp['mb_s']:.0f} MB/s ({imp['mib_s']:.0f} MiB/s, median of {len(imp['samples'])}), "
              f"{100 * imp['share_of_disk_write']:.0f}% of the disk's {imp['disk_write']['mb_s']:.0f} MB/s write bandwidth")
    print(f"import: {r['import_mb_s']:.0f} MiB/s; peak RSS base {rss['base'] / 2**20:.0f} MiB "
          f"(estimate {est['base'] / 2**20:.0f}), LoRA {rss['lora'] / 2**20:.0f} MiB (estimate "
          f"{est['lora'] / 2**20:.0f}); skipped: {r['skipped'] or 'none'}")
