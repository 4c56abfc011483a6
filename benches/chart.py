#!/usr/bin/env python3
"""A horizontal bar chart (SVG) of one column of a Markdown table, for docs/benchmarks.md.

    chart.py TABLE.md --label "case,workers" --value "ns / pkt" --title "..." [--after HEADING] > out.svg

Reads the first table (after the line containing HEADING, if given) whose header has the
label and value columns; one bar per row, labelled with the label columns joined. Cells may be
bold (**x**). Plain Python, no network, no plotting library: the SVG is written by hand.
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
    a = ap.parse_args()
    lines = open(a.table, encoding="utf-8").read().splitlines()
    if a.after:
        idx = next((i for i, l in enumerate(lines) if a.after in l), None)
        if idx is None:
            sys.exit(f"chart.py: {a.table}: no line containing {a.after!r}")
        lines = lines[idx:]
    labels = [c.strip() for c in a.label.split(",")]
    for header, rows in tables(lines):
        if a.value in header and all(l in header for l in labels):
            break
    else:
        sys.exit(f"chart.py: {a.table}: no table with columns {labels + [a.value]}")
    vi = header.index(a.value)
    li = [header.index(l) for l in labels]
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


if __name__ == "__main__":
    main()
