# Source this first in every device call (from the project root, with .gpu and .whl carried):
# it unpacks the GPU bundle (CuTe DSL, cutlass.operators, Optuna, DEAP) and the extra wheels
# (rich, cmaes, networkx) that the GPU machine lacks, and puts the working tree on PYTHONPATH.
# Build both once, from the project root:
#   .gpu/bundle.tar.xz: the unpacked packages CuTe DSL (nvidia-cutlass-dsl 4.8.1 and its libs),
#     nvidia-cutlass-operators 0.3.0, apache-tvm-ffi, Optuna 5.0.0 and DEAP 1.4.4 with their needs, recompressed
#     with xz; the script that builds it is not in this repository (it is part of the development setup)
#   echo /.whl/ >> .git/info/exclude; python3 -m pip download --no-deps --only-binary=:all: \
#     --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d .whl \
#     rich==15.0.0 mdurl cmaes networkx   # not pygments or markdown-it-py: evotune never uses rich.syntax or
#     rich.markdown, and the device call carries at most 64 MiB (networkx: cutlass.operators imports it;
#     its tests/ folders, 3 MB unpacked, are left out of the wheel: unzip, delete them and their RECORD
#     lines, zip again)
set -e
mkdir -p /tmp/site && tar xJf .gpu/bundle.tar.xz -C /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD
export PYTHONUNBUFFERED=1 TVM_FFI_DISABLE_TORCH_C_DLPACK=1
set +e
