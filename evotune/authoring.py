"""The API a search space is written against: everything a space module takes from evotune.

A space module (a built-in in ``search_spaces/``, a user's ``.py`` file, or an ``evotune.search_spaces``
entry point) defines ``SPACE``, a :class:`SearchSpace`, and imports from this module only. It holds:

- declaring the space: :class:`SearchSpace`, the parameter kinds (:func:`ordinal`, :func:`categorical`,
  :func:`power_of_two`, :func:`int_range`, :func:`boolean`, :func:`tuples`), :func:`constraint` and
  :func:`hardware_limit` (named rules, with the message shown when they prune), :class:`Needs` (the DSL
  or compiler a space's builds need), :func:`deferred` (a GPU-only function imported on first call);
- what feasibility and estimates read: :class:`Point`, :class:`Context`, :class:`Problem`,
  :class:`Hardware`, :func:`get_hardware`, :func:`detect`, :func:`get_workload`;
- building: :class:`KernelCache` (compiled kernels on disk, each built once per cache), the resource
  readers of a compiled object (:func:`read_object`, :func:`launch_smem_from_ir`), and another space by
  name (:func:`load_space`);
- a workload's inputs and layouts, for compile-only builds and reorders: :func:`gemm_inputs`,
  :func:`gemm_dtypes` and :data:`SCALE_BLOCK` (GEMM; the group of a block-scaled fp8 GEMM),
  :class:`ConvShape`, :data:`VECT`, :func:`to_layout`, :func:`to_nhwc` and :func:`conv2d_nhwc` (conv2d).

Example::

    from evotune.authoring import SearchSpace, constraint, power_of_two

    SPACE = SearchSpace("tiled", [power_of_two("block", 16, 128)],
                        constraints=[constraint("fits", lambda p, ctx: p["block"] <= 64, "block {block} > 64")])
"""

from evotune.core.hardware import Hardware, detect, get_hardware
from evotune.core.params import ParamValue, SpacePoint
from evotune.core.plugins import load_space
from evotune.core.problem import SCALE_BLOCK, Problem, get_workload
from evotune.core.space import (
    Constraint,
    Context,
    Needs,
    SearchSpace,
    boolean,
    categorical,
    constraint,
    deferred,
    hardware_limit,
    int_range,
    ordinal,
    power_of_two,
    tuples,
)
from evotune.measurement.binary import launch_smem_from_ir, read_object
from evotune.measurement.kernel_cache import KernelCache
from evotune.measurement.workloads.conv2d import conv2d_nhwc
from evotune.measurement.workloads.conv2d_shape import VECT, ConvShape, to_layout, to_nhwc
from evotune.measurement.workloads.gemm import make_inputs as gemm_inputs
from evotune.measurement.workloads.gemm import torch_dtypes as gemm_dtypes

#: a point as a space's own functions read it (``evotune.core.params.SpacePoint``): each value the type of its
#: parameter's choices, one of :data:`ParamValue`
Point = SpacePoint

__all__ = [
    "SCALE_BLOCK", "VECT", "Constraint", "Context", "ConvShape", "Hardware", "KernelCache", "Needs", "ParamValue",
    "Point", "Problem", "SearchSpace", "boolean", "categorical", "constraint", "conv2d_nhwc", "deferred", "detect",
    "gemm_dtypes", "gemm_inputs", "get_hardware", "get_workload", "hardware_limit", "int_range",
    "launch_smem_from_ir", "load_space", "ordinal", "power_of_two", "read_object", "to_layout", "to_nhwc", "tuples",
]
