"""Reward functions that fail are reported clearly, on every rank, instead of hanging or training on garbage.

TRL calls reward functions on each process's rows and then gathers the rewards. A function that raises
on one rank leaves the other ranks waiting in the gather forever; one that returns ``inf`` or a string
either crashes with an unrelated tensor error or poisons the advantages. The guard wraps each
function: an exception or an invalid value is recorded (the rows become NaN so the gather still runs),
and after the gather every rank raises :class:`RewardFunctionError` naming the function.
``None`` stays legal: it is TRL's way to say "unscorable" (advantage 0).
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import traceback
from typing import Any, Callable

import torch


class RewardFunctionError(RuntimeError):
    """A reward function raised or returned something that is not a finite number or None."""


class RewardGuard:
    """Wraps reward functions and collects their failures for one scoring call."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def wrap(self, reward_funcs: Any) -> Any:
        """Wrap every plain (sync or async) callable in ``reward_funcs``; models and model ids pass through."""
        if reward_funcs is None:
            return None
        single = not isinstance(reward_funcs, list)
        funcs = [reward_funcs] if single else list(reward_funcs)
        wrapped = [self._wrap_one(f) if _is_plain_callable(f) else f for f in funcs]
        return wrapped[0] if single else wrapped

    def _wrap_one(self, func: Callable[..., Any]) -> Callable[..., Any]:
        name = getattr(func, "__name__", type(func).__name__)
        if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None)):

            @functools.wraps(func)
            async def guarded_async(*args: Any, **kwargs: Any) -> list[Any]:
                n = len(kwargs.get("completions", []))
                try:
                    return self._check(name, await func(*args, **kwargs), kwargs)
                except Exception as exc:  # noqa: BLE001 -- recorded and re-raised on every rank after the gather
                    return self._record_exception(name, exc, n)

            return guarded_async

        @functools.wraps(func)
        def guarded(*args: Any, **kwargs: Any) -> list[Any]:
            n = len(kwargs.get("completions", []))
            try:
                return self._check(name, func(*args, **kwargs), kwargs)
            except Exception as exc:  # noqa: BLE001
                return self._record_exception(name, exc, n)

        return guarded

    def _record_exception(self, name: str, exc: Exception, n: int) -> list[None]:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-3))
        self.failures.append(f"reward function {name!r} raised {type(exc).__name__}: {exc}\n{tb}")
        return [None] * n

    def _check(self, name: str, values: Any, kwargs: dict[str, Any]) -> list[Any]:
        n = len(kwargs.get("completions", []))
        try:
            values = list(values)
        except TypeError:
            self.failures.append(
                f"reward function {name!r} returned {type(values).__name__}, expected a list of {n} floats"
            )
            return [None] * n
        if len(values) != n:
            self.failures.append(f"reward function {name!r} returned {len(values)} rewards for {n} completions")
            return [None] * n
        for i, v in enumerate(values):
            if v is None:
                continue
            bad = not isinstance(v, (numbers.Real, torch.Tensor)) or isinstance(v, bool)
            if not bad:
                v = float(v)
                bad = not math.isfinite(v)
            if bad:
                completion = str(kwargs["completions"][i])[:200]
                self.failures.append(
                    f"reward function {name!r} returned {values[i]!r} for completion #{i} ({completion!r}); "
                    "return a finite float, or None for a completion that cannot be scored"
                )
                return [None] * n
        return [None if v is None else float(v) for v in values]

    def raise_if_failed(self, accelerator: Any) -> None:
        """Collective: every rank learns whether any rank's reward functions failed, and all raise together."""
        local = torch.tensor([len(self.failures)], device=accelerator.device)
        failed_anywhere = int(accelerator.gather(local).sum().item())
        messages, self.failures = self.failures, []
        if failed_anywhere:
            here = "\n".join(messages) if messages else "(this rank's reward functions succeeded)"
            raise RewardFunctionError(
                f"{failed_anywhere} reward function failure(s) across {accelerator.num_processes} process(es); "
                "stopping instead of training on NaN or garbage rewards. "
                f"On process {accelerator.process_index}:\n{here}"
            )


def _is_plain_callable(f: Any) -> bool:
    return callable(f) and not isinstance(f, (str, torch.nn.Module))
