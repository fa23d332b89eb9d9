"""tests/gpu/torch_gpu.py, the driver of issue 35's GPU checks (scripts/gpu-torch.sh on a lent GPU),
run here on CPU tensors (TORCH_GPU_ON_CPU=1) through the braid backend: a GPU run is rare, and a
driver broken here would spend it. Each check must print its PASS line, from every rank's result."""

import os
import subprocess
import sys

import pytest

DRIVER = os.path.join(os.path.dirname(__file__), "..", "gpu", "torch_gpu.py")


@pytest.mark.parametrize("check,ranks,expect", [
    ("allreduce", 2, "PASS allreduce braid 2 ranks: 32 cases on each rank, wrong: none"),
    ("allreduce", 3, "PASS allreduce braid 3 ranks: 32 cases on each rank, wrong: none"),
    ("barrier", 2, "PASS barrier braid 2 ranks: 8 cases on each rank, wrong: none"),
    ("ddp", 2, "PASS ddp braid 2 ranks: parameters after 50 steps"),
    ("fsdp", 2, "PASS fsdp braid 2 ranks: parameters after 10 steps"),
])
def test_the_gpu_driver_passes_on_cpu_tensors(tmp_path, check, ranks, expect):
    env = dict(os.environ, TORCH_GPU_ON_CPU="1", TORCH_GPU_REFERENCES=str(tmp_path))
    done = subprocess.run([sys.executable, DRIVER, "braid", str(ranks), check,
                           str(tmp_path / "out.json")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert expect in done.stdout, done.stdout + done.stderr


def test_the_gpu_driver_passes_under_torchrun_on_cpu_tensors(tmp_path):
    """As gpu-torch.sh runs p2p_first: under torchrun (its TCPStore, whose client a get holds)."""
    env = dict(os.environ, TORCH_GPU_ON_CPU="1", TORCH_GPU_REFERENCES=str(tmp_path))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           DRIVER, "braid", "2", "p2p_first"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS torchrun p2p_first braid 2 ranks: wrong on some rank: 0" in done.stdout, \
        done.stdout + done.stderr
