"""Imported by the forkserver of :mod:`evotune.measurement.processes` only: import the modules it names (and, for
an entry ``MODULE:FUNCTION``, call the function once: a cache computed before the forks, such as Triton's key of its
own build, a second of hashing in each process otherwise).

multiprocessing's own preloading lets only an ImportError pass; a module that raises anything else at import
(a driver library that will not load, say) would take the server down, and every process started after it.
Here each one may fail: the child that needs it imports it again and reports the error with its context.

Nothing here may initialise CUDA: a process forked after that cannot use the GPU. Two libraries would at
import time unless told otherwise (torch's availability check, which tvm-ffi calls when it patches torch's
streams): their switches are set first. A child checks what it inherited all the same
(:func:`evotune.measurement.processes.inherited_cuda`).
"""

import importlib
import os

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # torch.cuda.is_available() through NVML, no cuInit
os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")  # no torch add-on build, no CUDA check at import

for _name in filter(None, os.environ.get("EVOTUNE_PRELOAD", "").split(",")):
    _module, _, _function = _name.partition(":")
    try:
        _loaded = importlib.import_module(_module)
        if _function:  # MODULE:FUNCTION: called once here, so that every child inherits what it caches
            getattr(_loaded, _function)()
    except Exception:  # the child that needs it imports it again and reports why it fails
        pass
