# braid's torch.distributed backend: `pip install --no-build-isolation ./python` with the torch it
# will run with, after braid is built (BRAID_LIB_DIR: where libbraid.so is; default build/src of
# this checkout, else an installed prefix's lib).
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(here)
lib_dir = os.path.abspath(os.environ.get("BRAID_LIB_DIR", os.path.join(root, "build", "src")))
include_dir = os.path.abspath(os.environ.get("BRAID_INCLUDE_DIR", os.path.join(root, "include")))

setup(
    name="braid-torch",
    version="0.1.0",
    description="braid as a torch.distributed backend",
    packages=["braid_torch"],
    ext_modules=[
        CppExtension(
            "braid_torch._C",
            [os.path.join(here, "csrc", name)
             for name in ("backend.cc", "peer_channels.cc", "sparse.cc")],
            include_dirs=[include_dir],
            library_dirs=[lib_dir],
            libraries=["braid"],
            extra_link_args=[f"-Wl,-rpath,{lib_dir}"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
