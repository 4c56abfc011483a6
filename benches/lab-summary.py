#!/usr/bin/env python3
"""The summary of benches/lab.sh's target/lab-bench.jsonl as Markdown tables (stdout):
per forwarder the highest delivered rate, the highest offered rate without loss (< 0.1%),
CPU per packet and latency at half load, ratios, and every point of the loss curves.

    benches/lab-summary.py target/lab-bench.jsonl > target/lab-bench.md
"""
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
modes = [m for m in ["kxdp", "kxdp-deep", "kxdp-floor", "routing", "iptables", "nftables"] if any(r["mode"] == m for r in runs)]
def med(xs):
    return statistics.median(xs) if xs else 0.0
summary = {}
for m in modes:
    rs = [r for r in runs if r["mode"] == m and not r["half_load"]]
    half = [r for r in runs if r["mode"] == m and r["half_load"]]
    # Highest delivered rate at any offered rate (on a busy machine the `max` point is not
    # always the best one).
    best = max(r["delivered_pps"] for r in rs)
    # Highest offered rate delivered with under 0.1% loss.
    clean = max([r["offered_pps"] for r in rs if r["loss"] < 0.001] or [0])
    summary[m] = dict(best=best, clean=clean,
                      cpu=med([r["busy_ns_per_packet"] for r in half]),
                      p50=med([r["p50_us"] for r in half]), p99=med([r["p99_us"] for r in half]),
                      gen=max(r["offered_pps"] for r in rs))
print()
print("| forwarder | highest delivered (pps) | highest rate without loss (pps) | machine busy ns / packet at half load | latency p50 at half load (µs) | p99 (µs) | generator's highest offered (pps) |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for m in modes:
    s = summary[m]
    print(f"| {m} | {s['best']/1e3:.0f} k | {s['clean']/1e3:.0f} k | {s['cpu']:.0f} | {s['p50']:.1f} | {s['p99']:.1f} | {s['gen']/1e3:.0f} k |")
if "kxdp" in summary:
    k = summary["kxdp"]["best"]
    print()
    for base in ["kxdp-deep", "kxdp-floor", "routing", "iptables", "nftables"]:
        if base in summary and summary[base]["best"]:
            print(f"- kxdp (full pipeline) / {base}: {k / summary[base]['best']:.2f}x at their highest delivered rates")
print()
print("| forwarder | offered (pps) | delivered (pps) | loss | of which dropped at the sinks' rings | where frames were lost (counters that moved) |")
print("| --- | --- | --- | --- | --- | --- |")
for m in modes:
    for r in sorted((r for r in runs if r["mode"] == m and not r["half_load"]), key=lambda r: r["offered_pps"]):
        lost = r["sent"] - r["received"]
        at_sinks = r.get("sink_dropped")
        share = "-" if at_sinks is None or lost <= 0 else f"{100 * min(at_sinks, lost) / lost:.0f}%"
        # "lost": per-point counter deltas (veth XDP drops, tx_dropped) from tests/lab_bench.rs.
        where = ", ".join(f"{k} {v}" for k, v in sorted(r.get("lost", {}).items(), key=lambda x: -x[1])) or "-"
        print(f"| {m} | {r['offered_pps']:.0f} | {r['delivered_pps']:.0f} | {100*r['loss']:.2f}% | {share} | {where} |")
