"""torch.distributed through braid and through Gloo, measured in one run, interleaved: 2 processes,
float32 all_reduce from 8 B to 256 MiB (median time per call; each sample is one call after a
barrier, the slower rank's), and the time of a DDP training step of a 25 M-parameter MLP. Writes
a table (.md), the numbers (.json) and a plot (.png) to the directory given (default
bench/results/torch). Run with the environment of scripts/python-env.sh, braid_torch installed:

    $(scripts/python-env.sh) bench/torch/allreduce_vs_gloo.py

Not a test: timings, on 2 vCPUs that a hypervisor moves around.
"""

import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

import braid_torch  # noqa: F401

SIZES = [8 << (2 * i) for i in range(13)] + [256 << 20]  # 8 B, 32 B, ... 128 MiB, 256 MiB
DDP_STEPS = 20


def samples_for(nbytes):
    return max(5, min(200, (64 << 20) // max(nbytes, 1)))


def timed(group, tensor, samples):
    times = []
    for _ in range(samples):
        dist.barrier(group=group)
        start = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
        times.append(elapsed.item())
    return times


def back_to_back_us(group, calls=2000):
    """Calls in a row after a barrier, as nccl-tests and braid-perf time them: per call."""
    t = torch.ones(2)
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(t, group=group)
    elapsed = torch.tensor([(time.perf_counter() - start) / calls], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    return elapsed.item() * 1e6


def mlp():
    torch.manual_seed(0)  # 2048*4096 + 4096*2048 + 2048*1024 + 1024*4096 weights: 25.2 M
    return nn.Sequential(nn.Linear(2048, 4096), nn.ReLU(), nn.Linear(4096, 2048), nn.ReLU(),
                         nn.Linear(2048, 1024), nn.ReLU(), nn.Linear(1024, 4096))


def ddp_step_times(group, rank):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(mlp(), process_group=group)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(32, 2048, generator=g), torch.randn(32, 4096, generator=g)
    times = []
    for step in range(DDP_STEPS + 3):
        dist.barrier(group=group)
        start = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
        if step >= 3:
            times.append(elapsed.item())
    return times


def rank_main(rank, size, store, out):
    dist.init_process_group("braid", init_method=f"file://{store}", rank=rank, world_size=size)
    groups = {"braid": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    rows = []
    for nbytes in SIZES:
        t = torch.ones(max(1, nbytes // 4))
        for group in groups.values():  # warm-up
            timed(group, t, 2)
        got = {name: [] for name in groups}
        for _ in range(3):  # interleaved rounds
            for name, group in groups.items():
                got[name] += timed(group, t, samples_for(nbytes) // 3 + 1)
        rows.append({"bytes": nbytes, **{f"{n}_us": statistics.median(v) * 1e6
                                          for n, v in got.items()}})
    loop = {name: back_to_back_us(group) for name, group in groups.items()}
    ddp = {name: [] for name in groups}
    for _ in range(2):
        for name, group in groups.items():
            ddp[name] += ddp_step_times(group, rank)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"rows": rows, "back_to_back_8b_us": loop,
                       "ddp_ms": {n: statistics.median(v) * 1e3 for n, v in ddp.items()}}, f)
    dist.destroy_process_group()


def braid_c_api_8b_us(repo):
    """braid's own 8-byte all-reduce time (braid-perf, 2 processes), to tell torch's overhead."""
    perf = os.path.join(repo, "build", "tools", "braid-perf")
    out = subprocess.run([perf, "allreduce", "--np", "2", "-b", "8", "-e", "8", "-n", "2000",
                          "-w", "200"], capture_output=True, text=True, check=True).stdout
    row = [line for line in out.splitlines() if line.strip().startswith("8 ")][0]
    return float(row.split()[5])


def fmt_bytes(n):
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [r["bytes"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.loglog(sizes, [r["braid_us"] for r in rows], "o-", label="braid", base=2)
    ax.loglog(sizes, [r["gloo_us"] for r in rows], "s-", label="gloo", base=2)
    ax.set_yscale("log", base=10)
    ax.set_xticks(sizes[::2], [fmt_bytes(s) for s in sizes[::2]], rotation=30)
    ax.set_xlabel("message size")
    ax.set_ylabel("median time per call (us)")
    ax.set_title("torch.distributed.all_reduce, float32, 2 processes")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(repo, "bench", "results", "torch")
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "raw.json")
        mp.spawn(rank_main, args=(2, os.path.join(tmp, "store"), raw), nprocs=2, join=True)
        with open(raw) as f:
            result = json.load(f)
    rows = result["rows"]
    c_api = braid_c_api_8b_us(repo)
    result["braid_c_api_8b_us"] = c_api
    result["torch"] = torch.__version__
    stamp = datetime.date.today().isoformat()
    base = os.path.join(out_dir, "allreduce_vs_gloo")
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1)
    plot(rows, base + ".png")
    lines = [f"# torch.distributed all_reduce: braid vs gloo ({stamp}, torch {torch.__version__})",
             "",
             "2 processes, float32 sum, median time per call (the slower rank's, after a barrier),",
             "braid and gloo interleaved in one run. `bench/torch/allreduce_vs_gloo.py`.",
             "",
             "| size | braid (us) | gloo (us) | braid / gloo |",
             "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {fmt_bytes(r['bytes'])} | {r['braid_us']:.1f} | {r['gloo_us']:.1f} | "
                     f"{r['braid_us'] / r['gloo_us']:.2f} |")
    loop = result["back_to_back_8b_us"]
    lines += ["",
              f"8 B calls back to back (2000 in a row, per call, as braid-perf times them): braid's "
              f"C API (braid-perf, 2 processes) {c_api:.2f} us; torch.distributed through braid "
              f"{loop['braid']:.1f} us, through gloo {loop['gloo']:.1f} us. torch's own cost per "
              f"call (its dispatch, the Work and its future) is about "
              f"{loop['braid'] - c_api:.1f} us.",
              "",
              f"DDP step of a 25.2 M-parameter MLP (batch 32, SGD), median of {2 * DDP_STEPS}: "
              f"braid {result['ddp_ms']['braid']:.1f} ms, gloo {result['ddp_ms']['gloo']:.1f} ms "
              f"({result['ddp_ms']['braid'] / result['ddp_ms']['gloo']:.2f}x).",
              "", "![plot](allreduce_vs_gloo.png)", ""]
    with open(base + ".md", "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
