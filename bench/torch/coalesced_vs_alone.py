"""torch's coalesced collectives through braid: 8 reduce_scatter_tensor, then 8
all_gather_into_tensor calls in one _coalescing_manager each (FSDP's and torch's functional
collectives' shape), which reach the backend as one *_coalesced call that braid issues as one
group. Fused (braid's default: small calls that agree run as one pass) against the same group
with BRAID_GROUP_FUSE_BYTES=0 (each call alone, as the backend ran them before it grouped them),
2 processes, float32, each rank's piece 8 B - 64 KiB; ROUNDS runs of each, interleaved; median
microseconds per call of the runs' mean over ITERS batches. Writes a table to the path given
(default bench/results/torch/coalesced_vs_alone.md). Run with the environment of
scripts/python-env.sh, braid_torch installed:

    $(scripts/python-env.sh) bench/torch/coalesced_vs_alone.py [OUTPUT]

Not a test: timings, on 2 vCPUs that a hypervisor moves around.
"""

import datetime
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

SIZES = [8 << (2 * i) for i in range(7)] + [64 << 10]  # a rank's piece: 8 B ... 32 KiB, 64 KiB
CALLS = 8
ITERS = int(os.environ.get("ITERS", "300"))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
SIZE = 2


def batch_seconds(kind, n, size):
    """Seconds per batch of CALLS calls, each of n elements per rank's piece."""
    whole, piece = n * size, n
    outs = [torch.zeros(piece if kind == "rs" else whole) for _ in range(CALLS)]
    ins = [torch.ones(whole if kind == "rs" else piece) for _ in range(CALLS)]
    call = dist.reduce_scatter_tensor if kind == "rs" else dist.all_gather_into_tensor

    def once():
        with dist._coalescing_manager(device=torch.device("cpu")):
            for out, inp in zip(outs, ins):
                call(out, inp)

    for _ in range(10):
        once()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(ITERS):
        once()
    return (time.perf_counter() - start) / ITERS


def rank_main(rank, size, init, fuse, result_path):
    if fuse is not None:
        os.environ["BRAID_GROUP_FUSE_BYTES"] = fuse
    os.environ.setdefault("BRAID_DEVICE", "cpu")
    dist.init_process_group("braid", init_method=init, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=120))
    rows = []
    for nbytes in SIZES:
        n = nbytes // 4
        for kind in ("rs", "ag"):
            seconds = torch.tensor([batch_seconds(kind, n, size)], dtype=torch.float64)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slower rank's
            rows.append((kind, nbytes, seconds.item() / CALLS * 1e6))
    if rank == 0:
        with open(result_path, "w") as f:
            for kind, nbytes, us in rows:
                f.write(f"{kind} {nbytes} {us}\n")
    dist.destroy_process_group()


def run(fuse, work):
    result = os.path.join(work, "result")
    init = f"file://{os.path.join(work, 'store')}"
    if os.path.exists(os.path.join(work, "store")):
        os.remove(os.path.join(work, "store"))
    mp.spawn(rank_main, args=(SIZE, init, fuse, result), nprocs=SIZE, join=True)
    with open(result) as f:
        return {(k, int(b)): float(us) for k, b, us in (line.split() for line in f)}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    output = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        repo, "bench/results/torch/coalesced_vs_alone.md")
    samples = {"fused": [], "alone": []}
    with tempfile.TemporaryDirectory() as work:
        for _ in range(ROUNDS):
            samples["alone"].append(run("0", work))
            samples["fused"].append(run(None, work))
    commit = subprocess.run(["git", "-C", repo, "describe", "--always", "--dirty"],
                            capture_output=True, text=True).stdout.strip()
    lines = [
        "# torch coalesced reduce_scatter_tensor / all_gather_into_tensor through braid: fused "
        "against BRAID_GROUP_FUSE_BYTES=0",
        f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; braid {commit}; "
        f"torch {torch.__version__}; {os.cpu_count()} cores; {SIZE} processes; {CALLS} calls per "
        f"_coalescing_manager; {ITERS} batches per run; median of {ROUNDS} interleaved runs; "
        "microseconds per call (the slower rank's)",
        "",
        "| collective | bytes per rank's piece | alone (us) | fused (us) | fused/alone |",
        "|---|---|---|---|---|",
    ]
    for kind in ("rs", "ag"):
        for nbytes in SIZES:
            alone = statistics.median(s[(kind, nbytes)] for s in samples["alone"])
            fused = statistics.median(s[(kind, nbytes)] for s in samples["fused"])
            name = "reduce_scatter_tensor" if kind == "rs" else "all_gather_into_tensor"
            lines.append(f"| {name} | {nbytes} | {alone:.2f} | {fused:.2f} | {fused / alone:.2f} |")
    os.makedirs(os.path.dirname(output), exist_ok=True)
    with open(output, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
