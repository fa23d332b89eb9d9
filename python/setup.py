# braid's torch.distributed backend: `pip install --no-build-isolation ./python` with the torch it
# will run with, after braid is built (BRAID_LIB_DIR: where libbraid.so is; default build/src of
# this checkout, else an installed prefix's lib). Where that torch has CUDA, CUDA tensors are
# taken too: built against the CUDA runtime torch brings (NVIDIA's wheel), else the toolkit's.
import glob
import importlib.util
import os

import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
lib_dir = os.path.abspath(os.environ.get("BRAID_LIB_DIR", os.path.join(root, "build", "src")))
include_dir = os.path.abspath(os.environ.get("BRAID_INCLUDE_DIR", os.path.join(root, "include")))


def cuda_runtime():
    """(headers, library folder, library) of the CUDA runtime torch runs on, or None."""
    if torch.version.cuda is None:
        return None
    major = torch.version.cuda.split(".")[0]
    roots = []
    nvidia = importlib.util.find_spec("nvidia")
    for folder in (nvidia.submodule_search_locations or []) if nvidia else []:
        roots += [os.path.join(folder, f"cu{major}"), os.path.join(folder, "cuda_runtime")]
    from torch.utils.cpp_extension import CUDA_HOME

    roots += [CUDA_HOME] if CUDA_HOME else []
    for candidate in roots:
        headers = os.path.join(candidate, "include")
        for libs in ("lib", "lib64"):
            found = glob.glob(os.path.join(candidate, libs, f"libcudart.so.{major}*"))
            if os.path.exists(os.path.join(headers, "cuda_runtime_api.h")) and found:
                return headers, os.path.join(candidate, libs), f"libcudart.so.{major}"
    return None


sources = ["backend.cc", "mailbox.cc", "peer_channels.cc", "sparse.cc"]
include_dirs, library_dirs, libraries = [include_dir], [lib_dir], []
macros, link_args = [], [f"-Wl,-rpath,{lib_dir}"]
# libbraid.so where a build tree has it; else its soname's file (a carried bundle's lib/ has that).
if os.path.exists(os.path.join(lib_dir, "libbraid.so")):
    libraries.append("braid")
else:
    link_args.append("-l:libbraid.so.0")
cuda = cuda_runtime()
if cuda:
    sources.append("cuda_side.cc")
    include_dirs.append(cuda[0])
    library_dirs.append(cuda[1])
    libraries += ["c10_cuda", "torch_cuda"]
    macros.append(("BRAID_TORCH_CUDA", None))
    link_args.append(f"-l:{cuda[2]}")
print(f"braid_torch: CUDA tensors {'from ' + cuda[1] if cuda else 'not taken (no CUDA in torch)'}")

setup(
    name="braid-torch",
    version="0.1.0",
    description="braid as a torch.distributed backend",
    packages=["braid_torch"],
    ext_modules=[
        CppExtension(
            "braid_torch._C",
            [os.path.join(here, "csrc", name) for name in sources],
            include_dirs=include_dirs,
            library_dirs=library_dirs,
            libraries=libraries,
            define_macros=macros,
            extra_link_args=link_args,
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
