"""PyTorch on a GPU through braid, both ways (issue 35's GPU acceptance): the `braid` backend with
CUDA tensors, and torch's own `nccl` backend over braid's libnccl.so.2 (run this under
LD_PRELOAD=.../libnccl.so.2). Every rank is on cuda:0 (several ranks per GPU, which NCCL refuses).

  python3 tests/gpu/torch_gpu.py BACKEND RANKS CHECK [OUT.json]
  python3 -m torch.distributed.run --nproc-per-node RANKS tests/gpu/torch_gpu.py BACKEND RANKS allreduce
      (torchrun's launch: every rank runs the check, rank 0 prints the verdict of all; spawned
      ranks' results are every rank's too)

CHECK:
  ddp        DDP of a small model for 50 steps; its parameters against the same run on CPU tensors
             with gloo (made here too), within 1e-5 relative
  fsdp       FSDP2 (fully_shard) of the same model for 10 steps against DDP on CPU with gloo
  allreduce  all_reduce of CUDA tensors of every dtype and op against a reference computed here
             from every rank's input
  graph      all_reduce captured in a CUDA graph (after one call outside it, which makes the
             communicator), replayed 3 times on new inputs
  timing     all_reduce time of CUDA float tensors, 8 B - 256 MiB (median of 5 rounds)

Prints one line per result, `PASS`/`FAIL` first, and exits 1 on any FAIL. Needs no pytest (the lent
GPU machine's torch has none), only torch (and braid_torch for BACKEND braid). TORCH_GPU_ON_CPU=1
runs it on CPU tensors instead (the script's own check, where there is no GPU)."""

import datetime
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ON_CPU = os.environ.get("TORCH_GPU_ON_CPU") == "1"
STEPS = {"ddp": 50, "fsdp": 10}  # FSDP2's reference is DDP on CPU with gloo for as many steps


def model_and_data(seed, rank, device):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)
    ).to(device, torch.float64)
    generator = torch.Generator().manual_seed(1000 + rank)
    data = [
        (torch.randn(16, 32, generator=generator, dtype=torch.float64),
         torch.randn(16, 8, generator=generator, dtype=torch.float64))
        for _ in range(4)
    ]
    return model, [(x.to(device), y.to(device)) for x, y in data]


def train(model, data, steps):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(steps):
        x, y = data[step % len(data)]
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def full_parameters(model):
    out = []
    for p in model.parameters():
        p = p.full_tensor() if hasattr(p, "full_tensor") else p
        out.append(p.detach().to("cpu").reshape(-1))
    return torch.cat(out)


def rank_main(rank, size, store_path, backend, check, steps, result_path):
    device = torch.device("cpu") if backend == "gloo" or ON_CPU else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if backend == "braid":
        import braid_torch  # noqa: F401
    dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=120))
    try:
        torch.save(CHECKS[check](rank, size, device, steps), f"{result_path}.{rank}")
    finally:
        dist.destroy_process_group()


def check_ddp(rank, size, device, steps):
    model, data = model_and_data(7, rank, device)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    train(ddp, data, steps)
    return full_parameters(model)


def check_fsdp(rank, size, device, steps):
    from torch.distributed.fsdp import fully_shard

    model, data = model_and_data(7, rank, device)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    train(model, data, steps)
    return full_parameters(model)


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64]
OPS = {"SUM": dist.ReduceOp.SUM, "MAX": dist.ReduceOp.MAX, "MIN": dist.ReduceOp.MIN,
       "PRODUCT": dist.ReduceOp.PRODUCT}


def rank_input(r, dtype, n):
    # Small integers: every sum and product of up to 8 ranks is exact in every type (bfloat16's
    # included), so the order of the reduction cannot matter.
    values = (torch.arange(n, dtype=torch.int64) * 7 + r * 3) % 2 + (r % 2)
    return values.to(dtype)


def check_allreduce(rank, size, device, steps):
    verdicts = []
    for dtype in DTYPES:
        for name, op in OPS.items():
            n = 100_003
            inputs = [rank_input(r, dtype, n) for r in range(size)]
            reference = inputs[0].clone()
            for other in inputs[1:]:
                reference = {"SUM": torch.add, "MAX": torch.maximum, "MIN": torch.minimum,
                             "PRODUCT": torch.mul}[name](reference, other)
            t = torch.full((n,), 99, dtype=dtype, device=device)  # poisoned, then the input
            t.copy_(inputs[rank])
            dist.all_reduce(t, op=op)
            same = torch.equal(t.cpu(), reference)
            verdicts.append((str(dtype), name, same))
    return verdicts


def check_graph(rank, size, device, steps):
    n = 4099
    t = torch.zeros(n, device=device)
    dist.all_reduce(t)  # outside the capture: makes the communicator
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.cuda.graph(graph):
        dist.all_reduce(t)
    torch.cuda.current_stream().wait_stream(side)
    verdicts = []
    for replay in range(3):
        t.copy_(torch.arange(n, dtype=torch.float32) * (rank + 1) + replay)
        graph.replay()
        want = torch.arange(n, dtype=torch.float32) * (size * (size + 1) / 2) + replay * size
        verdicts.append(("replay", str(replay), torch.equal(t.cpu(), want)))
    return verdicts


def check_barrier(rank, size, device, steps):
    """Asynchronous all_reduces, then a barrier: when it returns every one of them has ended (as
    after ProcessGroupNCCL's barrier, which waits on the host), with the right values."""
    n = 4 << 20
    tensors = [torch.full((n,), float(rank + 1 + k), device=device) for k in range(4)]
    if device.type == "cuda":
        torch.cuda._sleep(200_000_000)  # ~0.1 s of cycles: the all_reduces follow this stream
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    verdicts = []
    if device.type == "cuda":  # else the check below could not fail
        verdicts += [("still running when the barrier was issued", str(k), not w.is_completed())
                     for k, w in enumerate(works)]
    dist.barrier()
    verdicts += [("ended before the barrier returned", str(k), w.is_completed())
                 for k, w in enumerate(works)]
    for k, t in enumerate(tensors):
        want = torch.full((n,), float(size * (size + 1) // 2 + size * k))
        verdicts.append(("value", str(k), torch.equal(t.cpu(), want)))
    return verdicts


def check_p2p_first(rank, size, device, steps):
    """Sends before the group's first collective of CUDA tensors: rank 1's isend to rank 0 is in
    flight (its channel meeting through the store) while rank 1's all_reduce makes the CUDA
    communicator, whose id rank 1 waits for until rank 0, once it has received, makes it. A wait
    for that id holding a TCPStore's client (torchrun's: run under it) kept the channel from
    meeting: both waited out the timeout (a FileStore's get holds nothing)."""
    n = 1 << 20
    got = torch.full((n,), -1.0, device=device)
    total = torch.full((n,), float(rank + 1), device=device)
    if rank == 0:
        time.sleep(0.5)  # rank 1's all_reduce waits for the id before this receive is posted
    if rank == 1:
        send = dist.isend(torch.arange(n, dtype=torch.float32, device=device), 0)
        dist.all_reduce(total)
        send.wait()
    else:
        if rank == 0:
            dist.irecv(got, 1).wait()
        dist.all_reduce(total)
    verdicts = [("all_reduce", "value", torch.equal(total.cpu(),
                                                    torch.full((n,), float(size * (size + 1) // 2))))]
    if rank == 0:
        verdicts.append(("receive", "value", torch.equal(got.cpu(), torch.arange(n).float())))
    return verdicts


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def check_timing(rank, size, device, steps):
    rows = []
    nbytes = 8
    while nbytes <= 256 << 20:
        t = torch.ones(max(nbytes // 4, 1), dtype=torch.float32, device=device)
        iters = 20 if nbytes <= 1 << 20 else 5
        for _ in range(3):
            dist.all_reduce(t)
        rounds = []
        for _ in range(5):
            synchronize(device)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            synchronize(device)
            rounds.append((time.perf_counter() - start) / iters * 1e6)
        rows.append((nbytes, statistics.median(rounds)))
        nbytes *= 8 if nbytes < 1 << 20 else 4
    return rows


CHECKS = {"ddp": check_ddp, "fsdp": check_fsdp, "allreduce": check_allreduce,
          "graph": check_graph, "barrier": check_barrier, "p2p_first": check_p2p_first,
          "timing": check_timing}


def run(backend, size, check, steps=0):
    """Every rank's result, by rank."""
    with tempfile.TemporaryDirectory() as folder:
        store, result = os.path.join(folder, "store"), os.path.join(folder, "result.pt")
        mp.spawn(rank_main, args=(size, store, backend, check, steps, result), nprocs=size,
                 join=True)
        return [torch.load(f"{result}.{r}") for r in range(size)]


def gloo_reference(size, steps):
    """DDP on CPU with gloo, kept in TORCH_GPU_REFERENCES (a folder) for the next check that needs
    the same one."""
    folder = os.environ.get("TORCH_GPU_REFERENCES")
    path = os.path.join(folder, f"gloo-ddp-{size}ranks-{steps}steps.pt") if folder else None
    if path and os.path.exists(path):
        return torch.load(path)
    reference = run("gloo", size, "ddp", steps)[0]
    if path:
        torch.save(reference, path)
    return reference


def main_under_torchrun(backend, check):
    """This process is one of torchrun's ranks: the check here, the verdict of all on rank 0."""
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cpu") if backend == "gloo" or ON_CPU else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if backend == "braid":
        import braid_torch  # noqa: F401
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=120))
    wrong = [f"{d} {o}" for d, o, same in CHECKS[check](rank, size, device, 0) if not same]
    failures = torch.tensor([len(wrong)], device=device)
    dist.all_reduce(failures)
    dist.destroy_process_group()
    if rank == 0:
        verdict = "FAIL" if failures.item() else "PASS"
        print(f"{verdict} torchrun {check} {backend} {size} ranks: wrong on some rank: "
              f"{failures.item()} (rank 0: {', '.join(wrong) or 'none'})")
    sys.exit(1 if failures.item() else 0)


def main():
    backend, size, check = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return main_under_torchrun(backend, check)
    out = sys.argv[4] if len(sys.argv) > 4 else None
    failed = False
    record = {"backend": backend, "ranks": size, "check": check, "torch": torch.__version__,
              "device": "cpu" if ON_CPU else torch.cuda.get_device_name(0)}
    if check in ("ddp", "fsdp"):
        # Every rank's parameters (its replica, or its shards gathered), the farthest from gloo's.
        got = run(backend, size, check, STEPS[check])
        reference = gloo_reference(size, STEPS[check])
        relative = max(((g - reference).abs().max() / reference.abs().max()).item() for g in got)
        failed = not relative <= 1e-5
        record["max_relative_difference"] = relative
        print(f"{'FAIL' if failed else 'PASS'} {check} {backend} {size} ranks: parameters after "
              f"{STEPS[check]} steps within {relative:.3g} of gloo's on CPU (bar 1e-5)")
    elif check in ("allreduce", "graph", "barrier", "p2p_first"):
        by_rank = run(backend, size, check)
        wrong = [f"rank {r}: {d} {o}" for r, verdicts in enumerate(by_rank)
                 for d, o, same in verdicts if not same]
        failed = bool(wrong)
        record["wrong"] = wrong
        print(f"{'FAIL' if failed else 'PASS'} {check} {backend} {size} ranks: "
              f"{len(by_rank[0])} cases on each rank, wrong: {', '.join(wrong) or 'none'}")
    else:
        rows = run(backend, size, check)[0]  # rank 0's times
        record["rows"] = rows
        for nbytes, us in rows:
            busbw = nbytes / us / 1e3 * 2 * (size - 1) / size
            print(f"PASS timing {backend} {size} ranks: {nbytes:>10} B {us:10.1f} us "
                  f"busbw {busbw:8.2f} GB/s")
    if out:
        with open(out, "w") as f:
            json.dump(record, f)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
