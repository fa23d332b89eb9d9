"""Runs a test's body on N ranks: spawned processes that meet through a file store in the test's
temporary directory and make the default process group with the backend under test."""

import datetime
import os

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

import braid_torch  # noqa: F401  (registers "braid")


def _rank_main(rank, size, store_path, backend, timeout_s, body, args):
    os.environ.setdefault("BRAID_DEVICE", "cpu")
    dist.init_process_group(
        backend,
        init_method=f"file://{store_path}",
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
    """run_ranks(size, body, *args, backend="braid", timeout_s=60): body(rank, size, *args) on
    every rank; a rank's exception fails the test with its traceback."""

    def run(size, body, *args, backend="braid", timeout_s=60):
        store = tmp_path / f"store-{backend}-{size}"
        mp.spawn(
            _rank_main,
            args=(size, str(store), backend, timeout_s, body, args),
            nprocs=size,
            join=True,
        )

    return run
