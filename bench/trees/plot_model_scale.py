"""Plots the cost model's predictions at scale (bench/results/model_scale.md, which
bench/trees/model_scale.sh writes) as docs/model_scale.png: for each kind of rank (CPU one per
host, CPU two per host, GPUs eight per NDv5 host) the predicted all-reduce time against the rank
count, one line per forced algorithm, at 8 B (latency) and 2 MiB (mid size), log-log. Beside the
CPU ranks, the network steps alone of a double binary tree (2 log2(hosts) hops), the floor NCCL's
trees approach. A forced algorithm that cannot run a size fell back to another; such points are
left out, so each line is the algorithm it names.

    build/venv/bin/python bench/trees/plot_model_scale.py [--table MD] [--out PNG]
"""

import argparse
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend first)

SIZES = ["8 B", "32 KiB", "2 MiB", "128 MiB"]
PLOTTED = ["8 B", "2 MiB"]
ROW = re.compile(r"^\| (\d+) \| ([a-z-]+) \|(.*)\|\s*$")
CELL = re.compile(r"\s*([0-9.]+) \(([a-z-]+)/([a-z]+)\)\s*")
TREE_STEPS = re.compile(r"(\d+) hosts (\d+) us")
# One colour per algorithm in every panel.
ALGORITHMS = ["ring", "direct", "doubling", "halving", "tree", "hier-doubling", "hier-halving"]


def read_table(path):
    """({section title: {algorithm: {size: [(ranks, us)]}}}, [(hosts, us)] of the tree's steps)."""
    sections, steps, title = {}, [], None
    with open(path) as table:
        for line in table:
            if line.startswith("### "):
                title = re.sub(r" \(us.*$", "", line[4:].strip())
                sections[title] = {}
                continue
            if "network steps alone" in line:
                steps = [(int(h), float(us)) for h, us in TREE_STEPS.findall(line)]
                continue
            match = ROW.match(line)
            if not match or title is None:
                continue
            ranks, algorithm, cells = int(match.group(1)), match.group(2), match.group(3)
            for size, cell in zip(SIZES, cells.split("|")):
                parsed = CELL.match(cell)
                if parsed and parsed.group(2) == algorithm:  # not a fallback
                    series = sections[title].setdefault(algorithm, {}).setdefault(size, [])
                    series.append((ranks, float(parsed.group(1))))
    return sections, steps


def plot(sections, steps, out):
    figure, axes = plt.subplots(len(sections), len(PLOTTED), figsize=(11, 4 * len(sections)),
                                squeeze=False)
    for row, (title, algorithms) in enumerate(sections.items()):
        for column, size in enumerate(PLOTTED):
            ax = axes[row][column]
            for algorithm, by_size in sorted(algorithms.items()):
                points = sorted(by_size.get(size, []))
                if points:
                    ax.plot(*zip(*points), marker="o", label=algorithm,
                            color=f"C{ALGORITHMS.index(algorithm) % 10}")
            if steps and title.startswith("CPU ranks, one per host") and size == "8 B":
                ax.plot(*zip(*steps), linestyle="--", color="grey",
                        label="2 log2(hosts) network hops")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("ranks")
            ax.set_ylabel("predicted all-reduce time (us)")
            ax.set_title(f"{title}: {size}", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    figure.suptitle("braid's cost model at scale (bench/results/model_scale.md)")
    figure.tight_layout()
    figure.savefig(out, dpi=90)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--table", default="bench/results/model_scale.md")
    parser.add_argument("--out", default="docs/model_scale.png")
    args = parser.parse_args()
    sections, steps = read_table(args.table)
    if not sections:
        sys.exit(f"no tables in {args.table}")
    plot(sections, steps, args.out)
    print(f"{args.out}: {len(sections)} kinds of rank, sizes {', '.join(PLOTTED)}")


if __name__ == "__main__":
    main()
