"""braid as a torch.distributed backend.

Importing this package registers the backend "braid" for CPU tensors, and for CUDA tensors where
it was built with torch's CUDA (HAS_CUDA):

    import braid_torch  # noqa: F401
    torch.distributed.init_process_group("braid", ...)
"""

import atexit

import torch
import torch.distributed as dist

from . import _C

__all__ = ["BACKEND", "HAS_CUDA"]

BACKEND = "braid"
HAS_CUDA = _C.has_cuda


def _create_backend(store, rank, size, timeout):
    # The default group's backend is made before torch records the group (is_initialized()).
    return _C.create_backend(store, rank, size, timeout, not dist.is_initialized())


# A process that ends without destroy_process_group: its groups' operations end, and their threads
# with them, while the interpreter is whole (they release tensors Python holds).
atexit.register(_C.leave_groups_at_exit)

if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(
        BACKEND, _create_backend, devices=["cpu", "cuda"] if HAS_CUDA else ["cpu"]
    )
