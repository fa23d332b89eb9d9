"""Point-to-point through braid and through Gloo, measured in one run, interleaved: 2 processes,
each posts an isend of N float32 to the other and an irecv of N from it, then waits for both
(what a pipeline stage's exchange does). Median time per exchange (each sample after a barrier,
the slower rank's) from 8 B to 128 MiB; the first exchange in each direction (braid makes a
channel's communicator then) is timed apart. Writes a table (.md) and the numbers (.json) to the
directory given (default bench/results/torch). Run with the environment of scripts/python-env.sh,
braid_torch installed:

    $(scripts/python-env.sh) bench/torch/p2p_vs_gloo.py

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

import braid_torch  # noqa: F401
from allreduce_vs_gloo import fmt_bytes, samples_for  # the all-reduce benchmark beside this one

SIZES = [8 << (2 * i) for i in range(13)]  # 8 B, 32 B, ... 128 MiB
ROUNDS = 3  # interleaved: braid, Gloo, braid, Gloo, ...


def exchange_s(group, peer, out, into):
    dist.barrier(group=group)
    start = time.perf_counter()
    works = [dist.isend(out, peer, group=group), dist.irecv(into, peer, group=group)]
    for work in works:
        work.wait()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    return elapsed.item()


def rank_main(rank, store_path, out_path):
    dist.init_process_group("braid", init_method=f"file://{store_path}", rank=rank, world_size=2)
    groups = {"braid": None, "gloo": dist.new_group(backend="gloo")}
    peer = 1 - rank
    first = {name: exchange_s(group, peer, torch.ones(2), torch.empty(2))
             for name, group in groups.items()}
    times = {name: {n: [] for n in SIZES} for name in groups}
    for _ in range(ROUNDS):
        for nbytes in SIZES:
            out, into = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
            for name, group in groups.items():
                for _ in range(max(1, samples_for(nbytes) // ROUNDS)):
                    times[name][nbytes].append(exchange_s(group, peer, out, into))
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump({"first_exchange_s": first,
                       "median_s": {name: {n: statistics.median(t) for n, t in by.items()}
                                    for name, by in times.items()}}, f)
    dist.destroy_process_group()


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "bench/results/torch"
    os.makedirs(out_dir, exist_ok=True)
    os.environ.setdefault("BRAID_DEVICE", "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        numbers = os.path.join(tmp, "numbers.json")
        mp.spawn(rank_main, args=(os.path.join(tmp, "store"), numbers), nprocs=2, join=True)
        with open(numbers) as f:
            result = json.load(f)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    result.update(commit=commit, torch=torch.__version__,
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"))
    with open(os.path.join(out_dir, "p2p_vs_gloo.json"), "w") as f:
        json.dump(result, f, indent=1)
    median = result["median_s"]
    lines = [f"# isend + irecv both ways, 2 processes: braid against Gloo (commit {commit}, "
             f"torch {torch.__version__}, {result['date']})", "",
             "First exchange (braid makes each direction's channel): "
             f"braid {result['first_exchange_s']['braid'] * 1e3:.1f} ms, "
             f"Gloo {result['first_exchange_s']['gloo'] * 1e3:.1f} ms.", "",
             "| size each way | braid (us) | Gloo (us) | braid / Gloo |", "|---|---|---|---|"]
    for n in SIZES:
        b, g = median["braid"][str(n)], median["gloo"][str(n)]
        lines.append(f"| {fmt_bytes(n)} | {b * 1e6:.1f} | {g * 1e6:.1f} | {b / g:.2f} |")
    with open(os.path.join(out_dir, "p2p_vs_gloo.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
