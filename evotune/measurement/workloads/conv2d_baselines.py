"""The conv2d workload's baselines: the convolutions a user would otherwise run, through cuDNN.

* ``cudnn fp16 conv2d (torch, channels_last)``: ``torch.nn.functional.conv2d`` on
  channels_last fp16 tensors with cuDNN's autotuner on. For an int8 problem it
  runs the same shape in fp16 (the precision a user falls back to), on fp16
  copies of the inputs made once by its ``prepare``; for fp16 and bf16
  problems it runs the problem's own dtype. conv2d has no ``out=``: the time
  includes copying its output into place.
* ``cudnn int8 conv2d (frontend graph)``: for int8 problems, a cuDNN graph
  built with the cuDNN frontend (``nvidia-cudnn-frontend``): an int8 NHWC
  convolution with int32 accumulation, the scale multiplied in fp32 and the
  output written as int8, the same computation as the problem's. Its
  ``prepare`` copies the inputs to NHWC once and builds the graph; where
  cuDNN has no engine for it, building fails and the run records the error.

Each is called ``fn(*fn.prepare(inputs))`` (see :mod:`evotune.core.problem`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from evotune.core.problem import Problem


def cudnn_fp16(problem: Problem) -> Callable[..., object]:
    """cuDNN through torch, channels_last, in the problem's float dtype (fp16 for an int8 problem)."""
    import torch
    import torch.nn.functional as F

    from evotune.measurement.workloads.conv2d_shape import ConvShape, to_nhwc

    s = ConvShape.of(problem)

    def conv(x: Any, w: Any, y: Any) -> object:
        with torch.backends.cudnn.flags(enabled=True, benchmark=True):
            out = F.conv2d(x, w, stride=s.stride, padding=s.pad, dilation=s.dilation)
        return y.copy_(out)

    def prepare(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        x, w, y = inputs[0], inputs[1], inputs[-1]
        if problem.dtype == "int8":  # fp16 copies of the same values, once; the output a buffer of its own
            x = to_nhwc(x, problem.layout).half().contiguous()
            w = to_nhwc(w, problem.layout).half().contiguous()
            y = torch.empty((s.N, s.P, s.Q, s.K), dtype=torch.float16, device=x.device)
        # NHWC storage seen as NCHW: channels_last tensors
        return x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2), y.permute(0, 3, 1, 2)

    conv.prepare = prepare  # type: ignore[attr-defined]
    return conv


def cudnn_int8(problem: Problem) -> Callable[..., object]:
    """cuDNN's own int8 convolution through the cuDNN frontend's graph API, scaled to int8 like the problem."""
    import torch

    from evotune.measurement.workloads.conv2d_shape import ConvShape, to_nhwc

    s = ConvShape.of(problem)
    state: dict[str, Any] = {}

    def conv(x: Any, w: Any, scale: Any, y: Any) -> object:
        import cudnn

        # on the caller's stream (the oracle captures a CUDA graph on a stream of its own)
        cudnn.set_stream(handle=state["handle"], stream=torch.cuda.current_stream().cuda_stream)
        state["graph"].execute({state["X"]: x, state["W"]: w, state["A"]: scale, state["Z"]: y},
                               state["workspace"], handle=state["handle"])
        return y

    def prepare(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        import cudnn

        x = to_nhwc(inputs[0], problem.layout).contiguous()
        w = to_nhwc(inputs[1], problem.layout).contiguous()
        scale = inputs[2]
        y = torch.empty((s.N, s.P, s.Q, s.K), dtype=torch.int8, device=x.device)
        if "graph" not in state:
            handle = cudnn.create_handle()
            dt = cudnn.data_type
            g = cudnn.pygraph(io_data_type=dt.INT8, intermediate_data_type=dt.FLOAT, compute_data_type=dt.INT32,
                              handle=handle)
            # NHWC storage, described as NCHW dims with channels-last strides
            X = g.tensor(name="X", dim=[s.N, s.C, s.H, s.W], stride=[s.H * s.W * s.C, 1, s.W * s.C, s.C],
                         data_type=dt.INT8)
            W = g.tensor(name="W", dim=[s.K, s.C, s.R, s.S], stride=[s.R * s.S * s.C, 1, s.S * s.C, s.C],
                         data_type=dt.INT8)
            acc = g.conv_fprop(image=X, weight=W, padding=[s.pad, s.pad], stride=[s.stride, s.stride],
                               dilation=[s.dilation, s.dilation], compute_data_type=dt.INT32, name="conv")
            acc.set_data_type(dt.FLOAT)
            A = g.tensor(name="scale", dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=dt.FLOAT)
            Z = g.mul(a=acc, b=A, compute_data_type=dt.FLOAT, name="scale")
            Z.set_output(True).set_data_type(dt.INT8).set_dim([s.N, s.K, s.P, s.Q]).set_stride(
                [s.P * s.Q * s.K, 1, s.Q * s.K, s.K])
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            g.check_support()
            g.build_plans()
            state.update(graph=g, X=X, W=W, A=A, Z=Z, handle=handle,
                         workspace=torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device=x.device))
        return x, w, scale, y

    conv.prepare = prepare  # type: ignore[attr-defined]
    return conv
