"""Draws one PNG per figure from the records `tutti bench all` wrote in DIR/results/.

Usage: python3 plot.py DIR   (writes DIR/fig16.png, fig17.png, fig18.png, fig19.png, fig20.png)
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(results, experiment):
    path = results / f"{experiment}.json"
    return json.loads(path.read_text()) if path.exists() else []


def label(p):
    if p["system"] == "tutti":
        return f"tutti {p['mode']} {'1PC' if p['nodes'] == 1 else '2PC'}"
    return f"{p['system']} {p['mode']}"


def lines(points, key):
    out = {}
    for p in points:
        out.setdefault(key(p), []).append(p)
    return out


def fig16(results, out):
    points = load(results, "fig16")
    if not points:
        return
    fig, (tput, lat) = plt.subplots(1, 2, figsize=(12, 5))
    for name, ps in sorted(lines(points, label).items()):
        ps.sort(key=lambda p: p["outstanding"])
        xs = [p["outstanding"] for p in ps]
        style = "-o" if name.startswith("tutti") else "--s"
        tput.plot(xs, [p["throughput_per_s"] for p in ps], style, label=name)
        lat.plot(xs, [p["p50_us"] for p in ps], style, label=name)
    for ax, ylabel in [(tput, "operations/s"), (lat, "p50 latency (µs)")]:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("outstanding operations")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    tput.legend(fontsize=8)
    fig.suptitle("Fig. 16: 3 compare-and-swaps per operation")
    fig.tight_layout()
    fig.savefig(out / "fig16.png", dpi=100)


def line_plot(points, out, name, line, x, xlabel, ylabel, title, log_base):
    """Throughput against `x`, one line per value of `line`."""
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for label, ps in sorted(lines(points, lambda p: p[line]).items()):
        ps.sort(key=lambda p: p[x])
        ax.plot([p[x] for p in ps], [p["throughput_per_s"] for p in ps], "-o", label=label)
    ax.set_xscale("log", base=log_base)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=100)


def scaling(results, out, experiment, title):
    points = load(results, experiment)
    if points:
        line_plot(points, out, experiment, "mode", "nodes", "memory nodes (all on this machine)",
                  "minitransactions/s", title, 2)


def fig20(results, out):
    points = load(results, "fig20")
    if points:
        line_plot(points, out, "fig20", "operation", "overlap", "probability of pairwise overlap",
                  "committed minitransactions/s",
                  "Fig. 20: contention (8 items, spread 2, 4 log nodes)", 10)


def fig17(results, out):
    points = load(results, "fig17")
    if not points:
        return
    workloads = sorted({p["operation"] for p in points})
    variants = ["A", "B", "C", "D"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.2
    for i, v in enumerate(variants):
        ys = []
        for w in workloads:
            match = [p for p in points if p["operation"] == w and p["variant"] == v]
            ys.append(match[0]["throughput_per_s"] if match else 0)
        ax.bar([j + (i - 1.5) * width for j in range(len(workloads))], ys, width, label=v)
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel("minitransactions/s")
    ax.legend(title="system")
    ax.set_title("Fig. 17: A per-item, B batched, C 2PC combined, D 1PC")
    fig.tight_layout()
    fig.savefig(out / "fig17.png", dpi=100)


def main():
    out = Path(sys.argv[1])
    results = out / "results"
    fig16(results, out)
    fig17(results, out)
    scaling(results, out, "fig18", "Fig. 18: 3 CAS, spread 2")
    scaling(results, out, "fig19", "Fig. 19: 16 CAS, spread = all nodes")
    fig20(results, out)


if __name__ == "__main__":
    main()
