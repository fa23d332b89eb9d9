"""Runs a test's body on N ranks: spawned processes that meet through a store (a file in the
test's temporary directory, or a TCPStore hosted by the parent as torchrun's agent hosts it) and
make the default process group with the backend under test."""

import datetime
import os

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

import braid_torch  # noqa: F401  (registers "braid")


def _rank_main(rank, size, meeting, backend, timeout_s, body, args):
    os.environ.setdefault("BRAID_DEVICE", "cpu")
    timeout = datetime.timedelta(seconds=timeout_s)
    kind, where = meeting
    if kind == "tcp":
        store = dist.TCPStore("127.0.0.1", where, is_master=False, timeout=timeout)
        meet = {"store": store}
    else:
        meet = {"init_method": where}
    dist.init_process_group(backend, rank=rank, world_size=size, timeout=timeout, **meet)
    try:
        body(rank, size, *args)
    finally:
        dist.destroy_process_group()


@pytest.fixture
def run_ranks(tmp_path):
    """run_ranks(size, body, *args, backend="braid", timeout_s=60, store="file"):
    body(rank, size, *args) on every rank; a rank's exception fails the test with its traceback.
    store="tcp": the ranks meet through a TCPStore this process serves on the loopback. It listens
    on a port the kernel picks and keeps it: a port probed free and bound later by rank 0 can be
    taken in between (CI saw EADDRINUSE so)."""

    def run(size, body, *args, backend="braid", timeout_s=60, store="file"):
        server = None
        if store == "tcp":
            server = dist.TCPStore(
                "127.0.0.1", 0, is_master=True, wait_for_workers=False,
                timeout=datetime.timedelta(seconds=timeout_s),
            )
            meeting = ("tcp", server.port)
        else:
            meeting = ("file", f"file://{tmp_path / f'store-{backend}-{size}'}")
        mp.spawn(
            _rank_main,
            args=(size, meeting, backend, timeout_s, body, args),
            nprocs=size,
            join=True,
        )

    return run
