"""Requests/s against clients as an SVG line chart: one line per series, the clients evenly spaced (they
grow by factors: 1, 8, 64). Written as text: one small chart needs no plotting library."""

from html import escape
from pathlib import Path

WIDTH, HEIGHT, MARGIN = 640, 400, 64
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def line_chart(path: Path, title: str, clients: list[int], series: dict[str, list[float]]) -> None:
    """`series`: label → requests/s at each of `clients`; a label that starts with "Triton" is dashed."""
    top = max(max(values) for values in series.values()) * 1.1 or 1
    plot_w, plot_h = WIDTH - 2 * MARGIN, HEIGHT - 2 * MARGIN

    def x(index: int) -> float:
        return MARGIN + plot_w * index / max(len(clients) - 1, 1)

    def y(value: float) -> float:
        return HEIGHT - MARGIN - plot_h * value / top

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">',
             f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
             f'<text x="{WIDTH / 2}" y="24" text-anchor="middle" font-size="14">{escape(title)}</text>',
             f'<line x1="{MARGIN}" y1="{HEIGHT - MARGIN}" x2="{WIDTH - MARGIN}" y2="{HEIGHT - MARGIN}" stroke="black"/>',
             f'<line x1="{MARGIN}" y1="{MARGIN}" x2="{MARGIN}" y2="{HEIGHT - MARGIN}" stroke="black"/>',
             f'<text x="{WIDTH / 2}" y="{HEIGHT - 20}" text-anchor="middle">clients</text>',
             f'<text x="18" y="{HEIGHT / 2}" text-anchor="middle" transform="rotate(-90 18 {HEIGHT / 2})">requests/s</text>']
    for index, count in enumerate(clients):
        parts.append(f'<text x="{x(index)}" y="{HEIGHT - MARGIN + 18}" text-anchor="middle">{count}</text>')
    for step in range(5):
        value = top * step / 4
        parts.append(f'<line x1="{MARGIN}" y1="{y(value)}" x2="{WIDTH - MARGIN}" y2="{y(value)}" stroke="#ddd"/>')
        parts.append(f'<text x="{MARGIN - 6}" y="{y(value) + 4}" text-anchor="end">{value:,.0f}</text>')
    for number, (label, values) in enumerate(series.items()):
        colour, dashed = COLOURS[number // 2 % len(COLOURS)], label.startswith("Triton")
        points = " ".join(f"{x(i)},{y(v)}" for i, v in enumerate(values))
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        legend_y = HEIGHT - MARGIN - 16 * (len(series) - number)  # lower right: the lines rise from there
        parts.append(f'<line x1="{WIDTH - MARGIN - 200}" y1="{legend_y}" x2="{WIDTH - MARGIN - 176}" y2="{legend_y}" '
                     f'stroke="{colour}" stroke-width="2"{dash}/>')
        parts.append(f'<text x="{WIDTH - MARGIN - 170}" y="{legend_y + 4}">{escape(label)}</text>')
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts + ["</svg>"]) + "\n")
