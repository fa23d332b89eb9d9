"""PyTorch's own DistributedTest suite (torch/testing/_internal/distributed/distributed_test.py,
shipped in the torch wheel; what test/distributed/test_distributed_spawn.py runs for Gloo), run
on the braid backend as a user would:

    WORLD_SIZE=2 build/venv/bin/pytest tests/python/torch_suite.py [-k ...]

The suite is imported with BACKEND=gloo, so its decorators keep exactly the tests Gloo runs; then
its backend name is set to "braid", so each test's init_process_group (and new_group) makes
braid's process group. Each test spawns WORLD_SIZE fresh processes, which import this file
again (and so register braid). ctest's python_torch_suite runs EXPECTED_TO_PASS's tests.
"""

import os
import unittest

os.environ["BACKEND"] = "gloo"  # read when the suite is imported: Gloo's tests are kept
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # CPU tensors: the GPU tests skip
os.environ.setdefault("BRAID_DEVICE", "cpu")

import braid_torch  # noqa: E402,F401  (registers "braid" here and in every spawned rank)
from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed import distributed_test  # noqa: E402

distributed_test.BACKEND = braid_torch.BACKEND


class TestBraidDistributed(distributed_test.TestDistBackend,
                           distributed_test.DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


# Bodies that branch on the name "gloo" and leave a variable unset for any other backend.
for _name in ("test_accumulate_gradients_no_sync", "test_accumulate_gradients_no_sync_grad_is_view",
              "test_accumulate_gradients_no_sync_allreduce_hook",
              "test_accumulate_gradients_no_sync_allreduce_with_then_hook"):
    setattr(TestBraidDistributed, _name,
            unittest.skip("its body keys on the backend's name being 'gloo'")(lambda self: None))

if __name__ == "__main__":
    run_tests()
