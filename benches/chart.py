#!/usr/bin/env python3
"""Charts (SVG) of a Markdown table's columns, for docs/benchmarks.md.

    chart.py TABLE.md --label "case,workers" --value "ns / pkt" --title "..." [--after HEADING] > out.svg
    chart.py TABLE.md --curves --label forwarder --x "offered (pps)" --value "delivered (pps)" \
        [--scale 1e-3] [--unit "k pps"] [--diagonal] > out.svg

Reads the first table (after the line containing HEADING, if given) whose header has the
label and value columns. Bars (the default): one bar per row, labelled with the label columns
joined. Curves (--curves): one line per distinct label, through its rows' (x, value) points
sorted by x, with the diagonal x = y drawn for reference (offered = delivered: no loss). Cells
may be bold (**x**). Plain Python, no network, no plotting library: the SVG is written by hand.
"""
import argparse
import html
import sys


def tables(lines):
    """Yields (header, rows) for each Markdown table."""
    cur = None
    for line in lines + [""]:
        s = line.strip()
        if s.startswith("|") and s.endswith("|"):
            cells = [c.strip().replace("**", "") for c in s.strip("|").split("|")]
            if cur is None:
                cur = (cells, [])
            elif set("".join(cells)) <= set("-: "):
                continue
            else:
                cur[1].append(cells)
        elif cur is not None:
            yield cur
            cur = None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("table")
    ap.add_argument("--label", required=True, help="column(s) naming a bar, comma separated")
    ap.add_argument("--value", required=True, help="column giving its length")
    ap.add_argument("--title", default="")
    ap.add_argument("--after", default="", help="use the first matching table after this text")
    ap.add_argument("--unit", default="")
    ap.add_argument("--curves", action="store_true", help="line chart of --value against --x")
    ap.add_argument("--x", default="", help="--curves: the column of the x axis")
    ap.add_argument("--scale", type=float, default=1.0, help="--curves: multiply values by this")
    a = ap.parse_args()
    lines = open(a.table, encoding="utf-8").read().splitlines()
    if a.after:
        idx = next((i for i, l in enumerate(lines) if a.after in l), None)
        if idx is None:
            sys.exit(f"chart.py: {a.table}: no line containing {a.after!r}")
        lines = lines[idx:]
    labels = [c.strip() for c in a.label.split(",")]
    for header, rows in tables(lines):
        if a.value in header and all(l in header for l in labels) and (not a.curves or a.x in header):
            break
    else:
        sys.exit(f"chart.py: {a.table}: no table with columns {labels + [a.value]}")
    vi = header.index(a.value)
    li = [header.index(l) for l in labels]
    if a.curves:
        return curves(a, header, rows, li, vi)
    bars = []
    for r in rows:
        try:
            v = float(r[vi].split()[0].replace(",", ""))
        except (ValueError, IndexError):
            continue
        bars.append((" ".join(r[i] for i in li), v))
    if not bars:
        sys.exit(f"chart.py: {a.table}: no numeric values in column {a.value!r}")

    bar_h, gap, left, right, top = 22, 6, 190, 90, 40
    width = 760
    height = top + len(bars) * (bar_h + gap) + 30
    vmax = max(v for _, v in bars) or 1.0
    scale = (width - left - right) / vmax
    palette = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948"]
    groups = {}
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="13">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">'
        f"{html.escape(a.title or a.value)}</text>",
    ]
    for n, (label, v) in enumerate(bars):
        y = top + n * (bar_h + gap)
        colour = palette[groups.setdefault(label.split()[0], len(groups)) % len(palette)]
        w = max(v * scale, 1)
        shown = f"{v:g}{(' ' + a.unit) if a.unit else ''}"
        out.append(
            f'<text x="{left - 8}" y="{y + bar_h * 0.7}" text-anchor="end">{html.escape(label)}</text>'
        )
        out.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="{colour}"/>')
        out.append(f'<text x="{left + w + 6:.1f}" y="{y + bar_h * 0.7}">{html.escape(shown)}</text>')
    axis_y = top + len(bars) * (bar_h + gap)
    out.append(f'<line x1="{left}" y1="{top - 4}" x2="{left}" y2="{axis_y}" stroke="#333"/>')
    out.append(
        f'<text x="{left}" y="{axis_y + 18}" fill="#555">{html.escape(a.value)}'
        f"{(' (' + a.unit + ')') if a.unit else ''}</text>"
    )
    out.append("</svg>")
    sys.stdout.write("\n".join(out) + "\n")


def number(cell):
    return float(cell.split()[0].replace(",", "").rstrip("%"))


def nice_step(span):
    """A round tick step giving 4 to 10 ticks over span."""
    step = 10 ** len(str(int(span))) / 10 if span >= 1 else 0.1
    while span / step > 10:
        step *= 2
    while span / step < 4:
        step /= 2
    return step


def curves(a, header, rows, li, vi):
    xi = header.index(a.x)
    series = {}
    for r in rows:
        try:
            x, y = number(r[xi]) * a.scale, number(r[vi]) * a.scale
        except (ValueError, IndexError):
            continue
        series.setdefault(" ".join(r[i] for i in li), []).append((x, y))
    if not series:
        sys.exit(f"chart.py: {a.table}: no numeric values in columns {a.x!r}, {a.value!r}")
    width, height = 760, 480
    left, right, top, bottom = 80, 170, 40, 60
    pw, ph = width - left - right, height - top - bottom
    vmax = max(max(x, y) for pts in series.values() for x, y in pts) * 1.05 or 1.0
    step = nice_step(vmax)

    def px(x):
        return left + x / vmax * pw

    def py(y):
        return top + ph - y / vmax * ph

    palette = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1"]
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="13">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">'
        f"{html.escape(a.title or a.value)}</text>",
    ]
    t = 0.0
    while t <= vmax:
        out.append(f'<line x1="{px(t):.1f}" y1="{top}" x2="{px(t):.1f}" y2="{top + ph}" stroke="#eee"/>')
        out.append(f'<line x1="{left}" y1="{py(t):.1f}" x2="{left + pw}" y2="{py(t):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{px(t):.1f}" y="{top + ph + 16}" text-anchor="middle" fill="#555">{t:g}</text>')
        out.append(f'<text x="{left - 6}" y="{py(t) + 4:.1f}" text-anchor="end" fill="#555">{t:g}</text>')
        t += step
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="#333"/>')
    out.append(f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#333"/>')
    out.append(
        f'<line x1="{px(0):.1f}" y1="{py(0):.1f}" x2="{px(vmax):.1f}" y2="{py(vmax):.1f}" '
        f'stroke="#999" stroke-dasharray="4 4"/>'
    )
    unit = f" ({a.unit})" if a.unit else ""
    out.append(
        f'<text x="{left + pw / 2}" y="{height - 20}" text-anchor="middle">{html.escape(a.x + unit)}</text>'
    )
    out.append(
        f'<text x="18" y="{top + ph / 2}" text-anchor="middle" '
        f'transform="rotate(-90 18 {top + ph / 2})">{html.escape(a.value + unit)}</text>'
    )
    for n, (label, pts) in enumerate(series.items()):
        colour = palette[n % len(palette)]
        pts.sort()
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for x, y in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>')
        ly = top + 10 + n * 20
        out.append(f'<line x1="{left + pw + 12}" y1="{ly}" x2="{left + pw + 32}" y2="{ly}" stroke="{colour}" stroke-width="3"/>')
        out.append(f'<text x="{left + pw + 38}" y="{ly + 4}">{html.escape(label)}</text>')
    ly = top + 10 + len(series) * 20
    out.append(
        f'<line x1="{left + pw + 12}" y1="{ly}" x2="{left + pw + 32}" y2="{ly}" stroke="#999" stroke-dasharray="4 4"/>'
    )
    out.append(f'<text x="{left + pw + 38}" y="{ly + 4}">no loss</text>')
    out.append("</svg>")
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
