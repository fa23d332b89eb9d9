"""Runs a test's body on N ranks: spawned processes that meet through a store (a file in the
test's temporary directory, or a TCPStore as torchrun's) and make the default process group with
the backend under test."""

import datetime
import os
import socket

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

import braid_torch  # noqa: F401  (registers "braid")


def _rank_main(rank, size, init_method, backend, timeout_s, body, args):
    os.environ.setdefault("BRAID_DEVICE", "cpu")
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    try:
        body(rank, size, *args)
    finally:
        dist.destroy_process_group()


@pytest.fixture
def run_ranks(tmp_path):
    """run_ranks(size, body, *args, backend="braid", timeout_s=60, store="file"):
    body(rank, size, *args) on every rank; a rank's exception fails the test with its traceback.
    store="tcp": the ranks meet through a TCPStore on a free port of the loopback."""

    def run(size, body, *args, backend="braid", timeout_s=60, store="file"):
        if store == "tcp":
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                init_method = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        else:
            init_method = f"file://{tmp_path / f'store-{backend}-{size}'}"
        mp.spawn(
            _rank_main,
            args=(size, init_method, backend, timeout_s, body, args),
            nprocs=size,
            join=True,
        )

    return run
