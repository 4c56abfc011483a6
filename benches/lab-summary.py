#!/usr/bin/env python3
"""The summary of benches/lab.sh's target/lab-bench.jsonl as Markdown tables (stdout):
per forwarder the highest delivered rate, the highest offered rate without loss (< 0.1%),
CPU per packet and latency at half load, ratios, the goals for the AF_XDP path with
met / not met, and every point of the loss curves with where its frames were lost (the
counters that moved) and kxdp's worker's time on and waiting for its CPU.

    benches/lab-summary.py target/lab-bench.jsonl > target/lab-bench.md
"""
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
modes = [m for m in ["kxdp", "kxdp-ref", "kxdp-deep", "kxdp-floor", "routing", "iptables", "nftables"] if any(r["mode"] == m for r in runs)]
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
    for base in ["kxdp-ref", "kxdp-deep", "kxdp-floor", "routing", "iptables", "nftables"]:
        if base in summary and summary[base]["best"]:
            print(f"- kxdp (full pipeline) / {base}: {k / summary[base]['best']:.2f}x at their highest delivered rates")

def explain(counter):
    """A counter's name with what it means (docs/afxdp.md, "Frames the kernel drops")."""
    if counter.endswith("xsk rx_dropped"):
        return counter + " (fill ring empty)"
    if counter.endswith("xsk rx_ring_full"):
        return counter + " (RX ring full: the worker was late)"
    return counter

# The goals for the AF_XDP path. Below saturation: points offered less than 90% of the
# forwarder's highest delivered rate (the half-load point included).
def below_saturation(m):
    best = summary[m]["best"]
    return [r for r in runs if r["mode"] == m and r["offered_pps"] < 0.9 * best]
def status(ok):
    return "met" if ok else "not met"
goals = []
def ratio_goal(name, a, b, goal):
    if a in summary and b in summary and summary[b]["best"]:
        x = summary[a]["best"] / summary[b]["best"]
        goals.append((name, f"{x:.2f}x", f">= {goal}x", status(x >= goal)))
    else:
        goals.append((name, "-", f">= {goal}x", "not measured"))
ratio_goal("kxdp (full pipeline) / iptables DNAT, highest delivered", "kxdp", "iptables", 2.0)
ratio_goal("kxdp (full pipeline) / kxdp-floor (I/O only), highest delivered", "kxdp", "kxdp-floor", 0.8)
for m in [m for m in ["kxdp", "kxdp-ref", "kxdp-floor", "kxdp-deep"] if m in summary]:
    pts = below_saturation(m)
    sent = sum(r["sent"] for r in pts)
    lost = sum(max(r["sent"] - r["received"], 0) for r in pts)
    worst = max((r["loss"] for r in pts), default=0.0)
    st = "not measured" if not pts else ("met" if lost == 0 else ("met within 0.1%" if worst < 0.001 else "not met"))
    goals.append((f"{m}: no loss below saturation ({len(pts)} points under 90% of {summary[m]['best']/1e3:.0f} kpps)",
                  f"{lost} of {sent} lost (worst point {100*worst:.2f}%)", "0 lost", st))
for m in modes:
    s_ = summary[m]
    goals.append((f"{m}: CPU per packet, p50 / p99 at half load", f"{s_['cpu']:.0f} ns, {s_['p50']:.0f} / {s_['p99']:.0f} µs", "measured", "-"))
print()
print("| goal (AF_XDP path) | measured | goal | status |")
print("| --- | --- | --- | --- |")
for g in goals:
    print("| " + " | ".join(g) + " |")
print()
print("| forwarder | offered (pps) | delivered (pps) | loss | of which dropped at the sinks' rings | where frames were lost (counters that moved) | kxdp's worker: ms on CPU / ms waiting for it |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for m in modes:
    for r in sorted((r for r in runs if r["mode"] == m and not r["half_load"]), key=lambda r: r["offered_pps"]):
        lost = r["sent"] - r["received"]
        at_sinks = r.get("sink_dropped")
        share = "-" if at_sinks is None or lost <= 0 else f"{100 * min(at_sinks, lost) / lost:.0f}%"
        # "lost": per-point counter deltas (veth XDP drops, tx_dropped) from tests/lab_bench.rs.
        moved = dict(r.get("lost", {}))
        # Not a loss: what kxdp forwarded; delivered less than that was lost after kxdp.
        forwarded = moved.pop("kxdp forwarded", None)
        if forwarded is not None and forwarded > r["received"]:
            moved["forwarded by kxdp, not delivered"] = forwarded - r["received"]
        where = ", ".join(f"{explain(k)} {v}" for k, v in sorted(moved.items(), key=lambda x: -x[1])) or "-"
        w = "-" if r.get("worker_cpu_ms") is None else f"{r['worker_cpu_ms']} / {r['worker_wait_ms']}"
        print(f"| {m} | {r['offered_pps']:.0f} | {r['delivered_pps']:.0f} | {100*r['loss']:.2f}% | {share} | {where} | {w} |")
