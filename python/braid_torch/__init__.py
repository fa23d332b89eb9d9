"""braid as a torch.distributed backend.

Importing this package registers the backend "braid" for CPU tensors:

    import braid_torch  # noqa: F401
    torch.distributed.init_process_group("braid", ...)
"""

import torch
import torch.distributed as dist

from . import _C

__all__ = ["BACKEND"]

BACKEND = "braid"


def _create_backend(store, rank, size, timeout):
    return _C.create_backend(store, rank, size, timeout)


if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND, _create_backend, devices=["cpu"])
