#!/usr/bin/env python3
"""Charts (SVG) of a Markdown table's columns, for docs/benchmarks.md.

    chart.py TABLE.md --label "case,workers" --value "ns / pkt" --title "..." [--after HEADING] > out.svg
    chart.py TABLE.md --curves --label forwarder --x "offered (pps)" --value "delivered (pps)" \
        [--scale 1e-3] [--unit "k pps"] [--diagonal] > out.svg
    chart.py TABLE.md --xy --label case,workers --value "Mpps / worker" \
        --points "est-10k=10000:established,est-1m=1000000:established" --logx --xtitle flows > out.svg
    chart.py TABLE.md --xy --label case --x workers --value "Mpps total" --cases est-10k,new-1m > out.svg

Reads the first table (after the line containing HEADING, if given) whose header has the
label and value columns. Bars (the default): one bar per row, labelled with the label columns
joined. Curves (--curves): one line per distinct label, through its rows' (x, value) points
sorted by x, with the diagonal x = y drawn for reference (offered = delivered: no loss). XY
(--xy): a value against a quantity, one line per series (benches/replay.sh: Mpps against flows,
workers and Services). The x of a row is its --x column, or, with --points CASE=X[:SERIES],...,
given by the first label column's value (rows of other cases are left out); a row's series is
SERIES (else the case) with the other label columns appended. --cases keeps only the rows of the
cases listed, --where COLUMN=VALUE only the rows with that value; --logx draws x on a log scale. Cells may be bold (**x**). Plain Python, no network, no plotting library: the SVG is written by hand.
"""
import argparse
import html
import sys


PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1"]


def svg_open(width, height, title):
    """The first lines of a chart: the svg element, a white background and the title."""
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="13">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15" font-weight="bold">'
        f"{html.escape(title)}</text>",
    ]


def draw_series(out, series, px, py, legend_x, top, value_labels):
    """Each series as a line with its points (and their values, if asked), and its legend entry
    right of the plot at `legend_x`."""
    for n, (label, pts) in enumerate(series.items()):
        colour = PALETTE[n % len(PALETTE)]
        pts.sort()
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for x, y in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>')
            if value_labels:
                out.append(f'<text x="{px(x) + 5:.1f}" y="{py(y) - 6:.1f}" font-size="11" fill="{colour}">{y:g}</text>')
        ly = top + 10 + n * 20
        out.append(f'<line x1="{legend_x + 12}" y1="{ly}" x2="{legend_x + 32}" y2="{ly}" stroke="{colour}" stroke-width="3"/>')
        out.append(f'<text x="{legend_x + 38}" y="{ly + 4}">{html.escape(label)}</text>')


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
    ap.add_argument("--xy", action="store_true", help="line chart of --value against a quantity")
    ap.add_argument("--points", default="", help="--xy: CASE=X[:SERIES],... (x from the case)")
    ap.add_argument("--cases", default="", help="--xy: only these cases (first label column)")
    ap.add_argument("--where", default="", help="--xy: only rows with COLUMN=VALUE")
    ap.add_argument("--logx", action="store_true", help="--xy: log scale for x")
    ap.add_argument("--xtitle", default="", help="--xy: the x axis' title (default: --x)")
    a = ap.parse_args()
    lines = open(a.table, encoding="utf-8").read().splitlines()
    if a.after:
        idx = next((i for i, l in enumerate(lines) if a.after in l), None)
        if idx is None:
            sys.exit(f"chart.py: {a.table}: no line containing {a.after!r}")
        lines = lines[idx:]
    labels = [c.strip() for c in a.label.split(",")]
    for header, rows in tables(lines):
        need_x = (a.curves or (a.xy and not a.points)) and a.x
        if a.value in header and all(l in header for l in labels) and (not need_x or a.x in header):
            break
    else:
        sys.exit(f"chart.py: {a.table}: no table with columns {labels + [a.value]}")
    vi = header.index(a.value)
    li = [header.index(l) for l in labels]
    if a.curves:
        return curves(a, header, rows, li, vi)
    if a.xy:
        return xy(a, header, rows, li, vi)
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

    out = svg_open(width, height, a.title or a.value)
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
    draw_series(out, series, px, py, left + pw, top, value_labels=False)
    ly = top + 10 + len(series) * 20
    out.append(
        f'<line x1="{left + pw + 12}" y1="{ly}" x2="{left + pw + 32}" y2="{ly}" stroke="#999" stroke-dasharray="4 4"/>'
    )
    out.append(f'<text x="{left + pw + 38}" y="{ly + 4}">no loss</text>')
    out.append("</svg>")
    sys.stdout.write("\n".join(out) + "\n")


def xy(a, header, rows, li, vi):
    points = {}
    for p in filter(None, a.points.split(",")):
        case, _, rest = p.partition("=")
        x, _, name = rest.partition(":")
        points[case.strip()] = (float(x), name.strip())
    keep = set(filter(None, a.cases.split(",")))
    xi = header.index(a.x) if a.x and not a.points else None
    wcol, _, wval = a.where.partition("=")
    wi = header.index(wcol) if wcol else None
    series = {}
    for r in rows:
        case = r[li[0]]
        if (keep and case not in keep) or (points and case not in points):
            continue
        if wi is not None and r[wi] != wval:
            continue
        try:
            x = points[case][0] if points else number(r[xi])
            y = number(r[vi]) * a.scale
        except (ValueError, IndexError, TypeError):
            continue
        name = (points[case][1] if points else "") or case
        extra = ", ".join(f"{header[i]} {r[i]}" for i in li[1:])
        series.setdefault(name + (f", {extra}" if extra else ""), []).append((x, y))
    if not series:
        sys.exit(f"chart.py: {a.table}: no rows for the chart")
    import math

    xs = sorted({x for pts in series.values() for x, _ in pts})
    if a.logx and xs[0] <= 0:
        sys.exit("chart.py: --logx needs positive x values")
    fx = math.log10 if a.logx else (lambda v: v)
    x0, x1 = fx(xs[0]), fx(xs[-1])
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    pad = (x1 - x0) * 0.06
    x0, x1 = x0 - pad, x1 + pad
    width, height = 760, 440
    left, right, top, bottom = 70, 230, 40, 60
    pw, ph = width - left - right, height - top - bottom
    vmax = max(y for pts in series.values() for _, y in pts) * 1.1 or 1.0
    step = nice_step(vmax)

    def px(x):
        return left + (fx(x) - x0) / (x1 - x0) * pw

    def py(y):
        return top + ph - y / vmax * ph

    out = svg_open(width, height, a.title or a.value)
    t = 0.0
    while t <= vmax:
        out.append(f'<line x1="{left}" y1="{py(t):.1f}" x2="{left + pw}" y2="{py(t):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{left - 6}" y="{py(t) + 4:.1f}" text-anchor="end" fill="#555">{t:g}</text>')
        t += step
    for x in xs:
        label = f"{x:,.0f}" if x >= 1 else f"{x:g}"
        out.append(f'<line x1="{px(x):.1f}" y1="{top}" x2="{px(x):.1f}" y2="{top + ph}" stroke="#eee"/>')
        out.append(f'<text x="{px(x):.1f}" y="{top + ph + 16}" text-anchor="middle" fill="#555">{label}</text>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="#333"/>')
    out.append(f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#333"/>')
    xtitle = (a.xtitle or a.x) + (" (log scale)" if a.logx else "")
    out.append(f'<text x="{left + pw / 2}" y="{height - 20}" text-anchor="middle">{html.escape(xtitle)}</text>')
    unit = f" ({a.unit})" if a.unit else ""
    out.append(
        f'<text x="18" y="{top + ph / 2}" text-anchor="middle" '
        f'transform="rotate(-90 18 {top + ph / 2})">{html.escape(a.value + unit)}</text>'
    )
    draw_series(out, series, px, py, left + pw, top, value_labels=True)
    out.append("</svg>")
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
