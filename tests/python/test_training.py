"""Training through the braid backend: DDP for 50 steps ends at the parameters Gloo's run from
the same seed ends at; FSDP2 (fully_shard) likewise; a run launched by torchrun; a rank that
dies makes the others raise braid's error within the timeout instead of hanging."""

import os
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

STEPS = 50


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 8))


def batch(rank, step):
    g = torch.Generator().manual_seed(7919 * step + rank)
    return torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)


def train(model, rank):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        x, y = batch(rank, step)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def ddp_against_gloo(rank, size):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    gloo = dist.new_group(backend="gloo")
    with_braid = train(DDP(make_model()), rank)  # the default group: braid
    with_gloo = train(DDP(make_model(), process_group=gloo), rank)
    torch.testing.assert_close(with_braid, with_gloo, rtol=1e-6, atol=1e-7)
    # A communication hook (fp16 compression: the bucket's future chained with a cast back). The
    # fp16 sums of 3 or more ranks round in each library's order, so fp16's tolerance.
    hooked = []
    for group in (None, gloo):
        model = DDP(make_model(), process_group=group)
        model.register_comm_hook(group, default_hooks.fp16_compress_hook)
        hooked.append(train(model, rank))
    torch.testing.assert_close(hooked[0], hooked[1], rtol=1e-2, atol=5e-4)
    # PowerSGD: its callbacks issue all-reduces of their own while a bucket's completes.
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    model = DDP(make_model())
    model.register_comm_hook(powerSGD_hook.PowerSGDState(process_group=None, start_powerSGD_iter=2,
                                                         matrix_approximation_rank=1),
                             powerSGD_hook.powerSGD_hook)
    compressed = train(model, rank)
    first = compressed.clone()
    dist.broadcast(first, src=0)
    assert torch.equal(first, compressed), "PowerSGD left the ranks apart"
    # Every rank ends at the same parameters.
    first = with_braid.clone()
    dist.broadcast(first, src=0)
    assert torch.equal(first, with_braid)


@pytest.mark.parametrize("size", [2, 3])
def test_ddp_matches_gloo(run_ranks, size):
    run_ranks(size, ddp_against_gloo)


def fsdp_against_gloo(rank, size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    gloo = dist.new_group(backend="gloo")
    results = []
    for group in (None, gloo):
        model = make_model()
        mesh = init_device_mesh("cpu", (size,)) if group is None else \
            torch.distributed.device_mesh.DeviceMesh.from_group(group, "cpu")
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        params = train(model, rank)  # local shards
        results.append(params)
    torch.testing.assert_close(results[0], results[1], rtol=1e-6, atol=1e-7)


def test_fsdp2_matches_gloo(run_ranks):
    run_ranks(2, fsdp_against_gloo)


def dies_or_waits(rank, size):
    if rank == 1:
        os._exit(0)  # gone without a word
    t = torch.ones(1000)
    start = time.monotonic()
    with pytest.raises(Exception) as error:
        dist.all_reduce(t)
    assert time.monotonic() - start < 30, "the survivor waited past its timeout"
    assert "braid" in str(error.value), str(error.value)


def test_a_dead_rank_is_an_error_not_a_hang(run_ranks):
    # Rank 1 leaves with status 0, which the spawner accepts; any other ending of either rank
    # (rank 0's assertion, a crash, a nonzero status) fails the test.
    run_ranks(2, dies_or_waits, timeout_s=10)


SCRIPT = """
import torch, torch.distributed as dist
import braid_torch  # registers "braid"
dist.init_process_group("braid")
t = torch.full((4,), float(dist.get_rank() + 1))
dist.all_reduce(t)
n = dist.get_world_size()
assert torch.equal(t, torch.full((4,), float(n * (n + 1) // 2))), t
print("rank", dist.get_rank(), "ok")
dist.destroy_process_group()
"""


def torchrun(tmp_path, code, nproc):
    """Runs `code` as a script under torchrun with nproc processes; returns its stdout."""
    script = tmp_path / "script.py"
    script.write_text(code)
    launcher = os.path.join(os.path.dirname(sys.executable), "torchrun")
    result = subprocess.run(
        [launcher, "--standalone", "--nproc-per-node", str(nproc), str(script)],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
        env={**os.environ, "BRAID_DEVICE": "cpu"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_torchrun_launches_it(tmp_path):
    out = torchrun(tmp_path, SCRIPT, 3)
    assert out.count("ok") == 3, out


REINIT = """
import datetime, os, time
import torch, torch.distributed as dist
import braid_torch  # registers "braid"
rank = int(os.environ["RANK"])
job_store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False)  # torchrun's, which outlives the groups
MEETINGS = "braid_torch/p2p/meetings_in_flight"
for attempt in range(2):
    if attempt == 1 and rank == 1:  # as a rank that crashed while its channel met would leave it
        job_store.wait(["rank0-left"])  # (rank 0 would wait for it in its leave)
        job_store.add(MEETINGS, 1)
        job_store.set("leftover", "1")
    if attempt == 1 and rank == 0:
        job_store.set("rank0-left", "1")
        job_store.wait(["leftover"])
        time.sleep(2)  # rank 1 comes first: an id left from attempt 0 would be read at once
    dist.init_process_group("braid", timeout=datetime.timedelta(seconds=15))
    assert job_store.add(MEETINGS, 0) == 0, "a count of meetings left from before"
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((4,), 3.0)), t
    if rank == 0:
        dist.send(torch.arange(3.0) + attempt, 1)
    else:
        got = torch.empty(3)
        dist.recv(got, 0)
        assert torch.equal(got, torch.arange(3.0) + attempt), got
    store = dist.distributed_c10d._get_default_store()

    def checked_barrier(name):  # rank 1 must not pass before rank 0 has come
        if rank == 0:
            time.sleep(1)
            store.set(name, "1")
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=15))
        assert store.check([name]), f"{name}: let through without rank 0"

    checked_barrier(f"first-{attempt}")
    if attempt == 0:  # rank 0 releases rank 1 after it gave up: the release is left behind
        if rank == 1:
            try:
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=1))
                raise AssertionError("passed a barrier without rank 0")
            except RuntimeError:
                store.set("rank1-gave-up", "1")
        else:
            store.wait(["rank1-gave-up"], datetime.timedelta(seconds=15))
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=5))
    else:
        checked_barrier(f"second-{attempt}")
    print("rank", rank, "attempt", attempt, "ok", flush=True)
    dist.destroy_process_group()
"""


def test_a_group_made_again_in_the_same_job_meets_afresh(tmp_path):
    """torch names a group made again after destroy_process_group as before (an in-process
    restart), and torchrun's store outlives it: the second group's ranks must find none of the
    first's keys (its communicator's id, a channel's, the release of a monitored barrier that
    failed on rank 1, which rank 0 left behind), and starts the job's count of meetings in flight
    from 0 (a crashed rank's count would make every rank wait out its timeout leaving). Gloo
    fails this (its first group's addresses)."""
    out = torchrun(tmp_path, REINIT, 2)
    assert out.count("ok") == 4, out


EXIT_WITHOUT_DESTROY = """
import torch, torch.distributed as dist
import braid_torch  # registers "braid"
dist.init_process_group("braid")
rank, n = dist.get_rank(), dist.get_world_size()
waited = [dist.isend(torch.ones(1000), (rank + 1) % n), dist.irecv(torch.zeros(1000), (rank - 1) % n)]
for w in waited:
    w.wait()
for peer in range(n):  # posted, never waited
    if peer != rank:
        dist.isend(torch.ones(100000), peer)
        dist.irecv(torch.zeros(100000), peer)
dist.all_reduce(torch.ones(1000), async_op=True)
print("rank", rank, "ok")
"""


def test_a_process_that_ends_without_destroying_its_group_exits_cleanly(tmp_path):
    """Sends and receives waited or not, a collective not waited, and no destroy_process_group:
    every process still exits with status 0. Left to the interpreter's end, a channel's thread
    releasing a tensor took the GIL, which ended the thread through a noexcept frame (SIGABRT);
    braid_torch's atexit now runs and ends the groups' operations first."""
    out = torchrun(tmp_path, EXIT_WITHOUT_DESTROY, 3)
    assert out.count("ok") == 3, out


def test_the_readme_example_trains(tmp_path):
    """The README's torch script, as a user would copy it, under torchrun with 2 processes."""
    import re

    readme = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")
    with open(readme) as f:
        code = re.search(r"```python\n(.*?)```", f.read(), re.S).group(1)
    out = torchrun(tmp_path, code, 2)
    loss = float(re.search(r"loss ([0-9.]+)", out).group(1))
    assert loss < 1.0, out  # untrained: about 32 (the target is a sum of 32 normals)
