"""A CPU stand-in for an accelerator device, to catch device mix-ups (a CPU tensor meeting a CUDA one) without a GPU.

Tensors made by :func:`on_accelerator` report ``device='meta'`` but keep their real CPU values, so code runs to the
end with the values it would compute on a GPU. Inside :class:`FakeAcceleratorMode`:

- factory calls with ``device=<the accelerator>`` (``torch.zeros(n, device=x.device)``, ``.to(x.device)``) make
  accelerator tensors; calls without a device make plain CPU tensors, as on a GPU machine;
- an op mixing accelerator tensors with CPU tensors of dimension >= 1 raises :class:`DeviceMixError`, as CUDA does
  ("Expected all tensors to be on the same device"). Like CUDA, a 0-dim CPU tensor is accepted as a scalar by
  elementwise ops, and CPU index tensors may index an accelerator tensor. Composite ops that check devices
  themselves (``torch.quantile``'s q) raise their own error, since the tensors *report* different devices.

Written by hand because torch's own fake tensors (``FakeTensorMode``) carry no values, and stage code branches on
values (``bool(keep.any())``, ``float(...)``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

ACCELERATOR = torch.device("meta")  # reported device; needs no driver, unlike "cuda" on a CPU-only build
aten = torch.ops.aten
# CUDA accepts CPU index tensors for these (the indices are copied to the device); the indexed tensor and the
# values must still be on the accelerator.
_INDEX_OPS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}


class DeviceMixError(RuntimeError):
    """An op mixed accelerator tensors with CPU tensors, which fails on a real GPU."""


class AcceleratorTensor(torch.Tensor):
    """A CPU tensor (``elem``) that reports the accelerator device."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> "AcceleratorTensor":
        out = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            device=ACCELERATOR, requires_grad=False,
        )
        out.elem = elem
        return out

    def __repr__(self) -> str:  # noqa: D105
        return f"AcceleratorTensor({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: D105
        raise DeviceMixError(f"{func} on an accelerator tensor outside FakeAcceleratorMode; wrap the call in the mode")


def on_accelerator(t: torch.Tensor) -> AcceleratorTensor:
    """``t``'s values on the fake accelerator."""
    return AcceleratorTensor(t.detach().clone())


def to_cpu(x: Any) -> Any:
    """Unwrap every accelerator tensor in ``x`` (a tensor, or any nesting of lists/tuples/dicts)."""
    return tree_map(lambda t: t.elem if isinstance(t, AcceleratorTensor) else t, x)


def _is_accelerator(device: Any) -> bool:
    return device is not None and torch.device(device).type == ACCELERATOR.type


class FakeAcceleratorMode(TorchDispatchMode):
    """See the module docstring. ``ops`` counts the ops run on accelerator tensors (a check that the code under test
    really ran on them)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = dict(kwargs or {})
        checked = (args[:1] + args[2:], kwargs) if func in _INDEX_OPS else (args, kwargs)
        tensors = [t for t in tree_flatten(checked)[0] if isinstance(t, torch.Tensor)]
        on_acc = any(isinstance(t, AcceleratorTensor) for t in tensors)
        for t in tensors:
            if not isinstance(t, AcceleratorTensor) and t.device.type == ACCELERATOR.type:
                raise DeviceMixError(
                    f"{func}: a real meta tensor (no values) appeared; create it on the input's device"
                )
        cpu = [tuple(t.shape) for t in tensors if not isinstance(t, AcceleratorTensor) and t.dim() > 0]
        if on_acc and cpu:
            raise DeviceMixError(f"{func}: accelerator tensors mixed with CPU tensors of shape {cpu} (fails on a GPU: "
                                 "create the CPU tensor with device= the input's device)")
        if func in _INDEX_OPS and not on_acc:
            index_on_acc = any(isinstance(t, AcceleratorTensor) for t in tree_flatten(args[1:2])[0])
            if index_on_acc:
                raise DeviceMixError(f"{func}: a CPU tensor indexed with accelerator indices")
        device = kwargs.get("device")
        if device is not None:
            kwargs["device"] = torch.device("cpu")
        out = func(*to_cpu(args), **to_cpu(kwargs))
        wrap = _is_accelerator(device) or (on_acc and device is None)
        if on_acc:
            self.ops += 1
        return tree_map(lambda t: AcceleratorTensor(t) if wrap and isinstance(t, torch.Tensor) else t, out)


class _DataFactories(TorchFunctionMode):
    """``torch.tensor(data, device=<accelerator>)`` builds its tensor below the dispatcher (no factory op to
    intercept), so it is redirected here: built on the CPU, then wrapped. ``.tolist()`` reads the CPU values."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = dict(kwargs or {})
        if func in (torch.tensor, torch.as_tensor) and _is_accelerator(kwargs.get("device")):
            kwargs["device"] = torch.device("cpu")
            return AcceleratorTensor(func(*to_cpu(args), **kwargs))
        if func is torch.Tensor.tolist:  # works on CUDA tensors; torch refuses it on wrapper subclasses
            return func(*to_cpu(args), **kwargs)
        return func(*args, **kwargs)


class fake_accelerator:
    """Context manager: both modes; ``.ops`` as in :class:`FakeAcceleratorMode`."""

    def __enter__(self) -> FakeAcceleratorMode:
        self._functions, self._dispatch = _DataFactories(), FakeAcceleratorMode()
        self._functions.__enter__()
        return self._dispatch.__enter__()

    def __exit__(self, *exc) -> None:
        self._dispatch.__exit__(*exc)
        self._functions.__exit__(*exc)
