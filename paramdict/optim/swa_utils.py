"""Weight averaging (EMA and SWA) of keyed params and buffers, and `update_bn`.

The functional `torch.optim.swa_utils`: `AveragedModel` as `WeightAverage`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, Literal, cast

import attrs
import torch
from torch import Tensor, nn

from .._paramdict import ParamDict
from ._averaging import averaged as _averaged
from ._averaging import entry
from ._hyper import is_traced
from ._states import AveragedState

__all__ = ["AveragedState", "WeightAverage", "update_bn"]


def _check_decay(instance: object, attribute: Any, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        msg = f"`{attribute.name}` must be a number, got {type(value).__name__}."
        raise TypeError(msg)
    if not 0.0 <= value <= 1.0:
        msg = (
            f"Invalid decay value {value!r} provided. Please provide a value in "
            "[0,1] range."
        )
        raise ValueError(msg)


def _check_kind(instance: object, attribute: Any, value: Any) -> None:
    if value not in ("ema", "swa"):
        msg = f"`{attribute.name}` must be 'ema' or 'swa', got {value!r}."
        raise ValueError(msg)


@attrs.frozen(kw_only=True)
class WeightAverage:
    """A running average of keyed values: EMA or SWA, as `AveragedModel` keeps it.

    `update(state, values)` is `AveragedModel.update_parameters(model)`: the
    first update copies the values, each later one averages them in (`ema`: a
    `lerp` toward them by `1 - decay`; `swa`: `avg + (value - avg) / (n + 1)`).
    Pass `ParamDict.from_module(model, buffers=True)` for `use_buffers=True`;
    integer entries are averaged as torch does. Build one with
    `WeightAverage.ema(decay)` or `WeightAverage.swa()`.

    Attributes:
        kind: `"ema"` or `"swa"`.
        decay: The EMA decay, in [0, 1] (unused by `swa`).

    Raises:
        ValueError: If `decay` is outside [0, 1] or `kind` is unknown.
        TypeError: If `decay` is not a number.

    Example:
        >>> from paramdict import optim
        >>> ema = optim.WeightAverage.ema(0.5)
        >>> state = ema.init(ParamDict(w=torch.zeros(1)))
        >>> for value in (4.0, 0.0):
        ...     state = ema.update(state, ParamDict(w=torch.tensor([value])))
        >>> state.averaged["w"]
        tensor([2.])
    """

    kind: Literal["ema", "swa"] = attrs.field(validator=_check_kind)
    decay: float = attrs.field(default=0.999, validator=_check_decay)

    @classmethod
    def ema(cls, decay: float = 0.999, /) -> WeightAverage:
        """Return an exponential moving average (torch's `get_ema_multi_avg_fn`).

        Args:
            decay: The weight of the old average at each update, in [0, 1].

        Returns:
            A `WeightAverage` of kind `"ema"`.

        Raises:
            ValueError: If `decay` is outside [0, 1].

        Example:
            >>> from paramdict import optim
            >>> optim.WeightAverage.ema(0.99).decay
            0.99
        """
        return cls(kind="ema", decay=decay)

    @classmethod
    def swa(cls) -> WeightAverage:
        """Return the equal-weight average of stochastic weight averaging.

        Returns:
            A `WeightAverage` of kind `"swa"`.

        Example:
            >>> from paramdict import optim
            >>> optim.WeightAverage.swa().kind
            'swa'
        """
        return cls(kind="swa")

    def init(self, values: ParamDict, /) -> AveragedState:
        """Return the first state: a detached copy of `values`, none averaged yet.

        Args:
            values: The values to average (parameters, and buffers if wanted).

        Returns:
            An `AveragedState` with `n_averaged == 0`.

        Raises:
            TypeError: If `values` is not a ParamDict or holds booleans.

        Example:
            >>> from paramdict import optim
            >>> optim.WeightAverage.ema().init(ParamDict(w=torch.ones(1))).n_averaged
            tensor(0)
        """
        if not isinstance(cast(object, values), ParamDict):
            msg = (
                f"`values` must be a ParamDict, got {type(values).__name__}. Use "
                "`ParamDict.from_module(model, buffers=True)`."
            )
            raise TypeError(msg)
        _check_dtypes(values, None)
        # The count lives on the host, as the step counters do: reading it to
        # choose between a copy and an average waits for nothing.
        n = torch.zeros((), dtype=torch.long)
        return AveragedState(n, values.detach().clone())

    def update(
        self, state: AveragedState, values: Mapping[str, Tensor], /
    ) -> AveragedState:
        """Return the state with `values` averaged in; `state` is unchanged.

        Args:
            state: The state from `init` or the previous `update`.
            values: The current values, with the keys of the average.

        Returns:
            The next state, `n_averaged` one higher.

        Raises:
            TypeError: If `state` is not an `AveragedState` whose `n_averaged` is a
                0-dim `int64` tensor, or a value is boolean, or complex where the
                average is real.
            ValueError: If the keys or shapes of `values` differ from the
                average's, or `n_averaged` is negative.

        Example:
            >>> from paramdict import optim
            >>> swa = optim.WeightAverage.swa()
            >>> state = swa.init(ParamDict(w=torch.zeros(1)))
            >>> for value in (1.0, 2.0, 6.0):
            ...     state = swa.update(state, {"w": torch.tensor([value])})
            >>> state.averaged["w"]
            tensor([3.])
        """
        averaged, current, count = self._checked(state, values, "update")
        if count is not None:
            with torch.no_grad():
                made = _averaged(
                    self.kind,
                    self.decay,
                    averaged._vals,
                    current,
                    count,
                    in_place=False,
                )
            return AveragedState(
                state.n_averaged + 1, averaged._derive(_flagged(made, averaged._vals))
            )
        n = state.n_averaged
        new: list[Tensor] = []
        with torch.no_grad():
            for avg, value in zip(averaged._vals, current, strict=True):
                value = value.detach().to(avg.device)
                counted = n.to(avg.device)
                # The first update copies; `where` keeps it free of host reads.
                mixed = entry(self.kind, self.decay, avg, value, counted)
                new.append(torch.where(counted == 0, value.to(avg.dtype), mixed))
        return AveragedState(n + 1, averaged._derive(_flagged(new, averaged._vals)))

    def update_(
        self, state: AveragedState, values: Mapping[str, Tensor], /
    ) -> AveragedState:
        """Average `values` into the tensors of `state`; return `state`.

        The in-place `update`: one foreach kernel per device and dtype, the
        count advanced on the host, everything checked before any write.

        Args:
            state: The state from `init` or a previous update, written in place.
            values: The current values, with the keys of the average.

        Returns:
            `state`, its average and count updated.

        Raises:
            TypeError: As `update`; or if `state`'s count is not on the CPU, or
                is traced (use `update`).
            ValueError: As `update`.

        Example:
            >>> from paramdict import optim
            >>> ema = optim.WeightAverage.ema(0.5)
            >>> state = ema.init(ParamDict(w=torch.zeros(1)))
            >>> for value in (4.0, 0.0):
            ...     _ = ema.update_(state, ParamDict(w=torch.tensor([value])))
            >>> state.averaged["w"], state.n_averaged
            (tensor([2.]), tensor(2))
        """
        averaged, current, count = self._checked(state, values, "update_")
        if count is None:
            msg = (
                "`update_` reads the state's `n_averaged` on the host, and it is "
                f"on {state.n_averaged.device} or traced. Use `update`, or move "
                "the count to the CPU: `state._replace(n_averaged="
                "state.n_averaged.cpu())`."
            )
            raise TypeError(msg)
        with torch.no_grad():
            _averaged(
                self.kind, self.decay, averaged._vals, current, count, in_place=True
            )
            state.n_averaged.add_(1)
        return state

    def _checked(
        self, state: AveragedState, values: Mapping[str, Tensor], what: str
    ) -> tuple[ParamDict, list[Tensor], int | None]:
        """The average, the values in its order, and the count where readable."""
        _check_state(state)
        averaged = state.averaged
        current = averaged._aligned(values, what=f"`{what}` (average and values)")
        _check_shapes(averaged, current)
        _check_dtypes(averaged, current)
        n = state.n_averaged
        count = (
            int(n.item())
            if _readable(n) and not torch.compiler.is_compiling()
            else None
        )
        return averaged, current, count


def _check_state(state: object) -> None:
    """Raise unless `state` is an `AveragedState` with a count that can be used."""
    fix = "Use the state from `init` or `update` (or a checkpoint of it)."
    if not isinstance(state, AveragedState):
        msg = f"`state` must be an AveragedState, got {type(state).__name__}. {fix}"
        raise TypeError(msg)
    averaged: object = state.averaged
    if not isinstance(averaged, ParamDict):
        msg = (
            "The state's `averaged` must be a ParamDict, got "
            f"{type(averaged).__name__}. {fix}"
        )
        raise TypeError(msg)
    sparse = sorted(k for k, v in averaged.items() if v.layout != torch.strided)
    if sparse:
        msg = (
            f"The state's `averaged` must hold dense tensors; {sparse} are not "
            f"(an average is written element by element). {fix}"
        )
        raise TypeError(msg)
    n: object = state.n_averaged
    if not (isinstance(n, Tensor) and n.dim() == 0 and n.dtype == torch.long):
        got = (
            f"{n.dtype} tensor of shape {tuple(n.shape)}"
            if isinstance(n, Tensor)
            else type(n).__name__
        )
        msg = (
            "The state's `n_averaged` must be a 0-dim torch.int64 tensor, got "
            f"{got}. {fix}"
        )
        raise TypeError(msg)
    real = [k for k, v in averaged.items() if not v.is_meta]
    if n.is_meta and real:
        msg = (
            "The state's `n_averaged` is on the meta device, which holds no count, "
            f"while the average holds values (at {sorted(real)[:3]}). {fix}"
        )
        raise ValueError(msg)
    # One host read, on the CPU only: elsewhere it would wait for the device.
    count = int(n.item()) if _readable(n) else 0
    if count < 0:
        msg = f"The state's `n_averaged` must be >= 0, got {count}. {fix}"
        raise ValueError(msg)


def _readable(n: Tensor) -> bool:
    """Whether reading `n` is cheap and possible: on the CPU, not traced."""
    return n.device.type == "cpu" and not is_traced(n)


def _check_shapes(averaged: ParamDict, values: list[Tensor]) -> None:
    """Raise unless each value is a dense tensor with data, of its average's shape."""
    given: list[object] = list(values)
    kinds = sorted(
        (key, type(value).__name__)
        for key, value in zip(averaged.keys(), given, strict=True)
        if not isinstance(value, Tensor) or value.layout != torch.strided
    )
    if kinds:
        keys = [key for key, _ in kinds]
        got = ", ".join(f"{key!r}: {kind}" for key, kind in kinds)
        msg = (
            f"Values must be dense tensors; {keys} are not ({got}). Pass the "
            "current values as `init` was given them (`ParamDict.from_module`)."
        )
        raise TypeError(msg)
    metas = [
        (key, avg.is_meta, value.is_meta)
        for (key, avg), value in zip(averaged.items(), values, strict=True)
    ]
    empty = sorted(key for key, avg, value in metas if value and not avg)
    lost = sorted(key for key, avg, value in metas if avg and not value)
    if lost:
        msg = (
            f"The state's `averaged` is on the meta device at {lost}, which holds "
            "no data, while the values there are real: averaging into it would "
            "drop them. Start the average with `init` on real values (or "
            "`state.averaged.to(...)` a real device)."
        )
        raise ValueError(msg)
    if empty:
        msg = (
            f"Values on the meta device hold no data to average: {empty}. Pass "
            "values on a real device (they are moved to the average's)."
        )
        raise ValueError(msg)
    differ = sorted(
        (key, tuple(avg.shape), tuple(value.shape))
        for (key, avg), value in zip(averaged.items(), values, strict=True)
        if value.shape != avg.shape
    )
    if differ:
        keys = [key for key, _, _ in differ]
        shapes = ", ".join(f"{key!r}: {got} for {want}" for key, want, got in differ)
        msg = (
            f"Shapes differ from the average's at {keys} ({shapes}). Pass values "
            "shaped like the ones `init` was given."
        )
        raise ValueError(msg)


def _check_dtypes(averaged: ParamDict, values: list[Tensor] | None) -> None:
    """Raise for boolean entries, or complex values averaged into real entries."""
    pairs = [
        (key, avg, avg if values is None else values[i])
        for i, (key, avg) in enumerate(averaged.items())
    ]
    booleans = sorted(
        key for key, avg, value in pairs if torch.bool in (avg.dtype, value.dtype)
    )
    if booleans:
        msg = (
            f"Boolean entries cannot be averaged: {booleans}. Leave them out (e.g. "
            "`values.exclude(...)`) or convert them to a floating dtype."
        )
        raise TypeError(msg)
    complex_ = sorted(
        key for key, avg, value in pairs if value.is_complex() and not avg.is_complex()
    )
    if complex_:
        msg = (
            f"Complex values cannot be averaged into real entries: {complex_}. Pass "
            "real values, or `init` with complex ones."
        )
        raise TypeError(msg)


def update_bn(
    values: ParamDict,
    module: nn.Module,
    loader: Iterable[Any],
    /,
    *,
    device: int | torch.device | None = None,
) -> ParamDict:
    """Return `values` with BatchNorm running statistics recomputed over `loader`.

    The keyed `torch.optim.swa_utils.update_bn`, run on a copy of `module`
    holding `values` (`module` is unchanged): one pass over `loader` re-estimates
    every BatchNorm's running statistics.

    Args:
        values: Parameters and buffers for `module` (e.g. an SWA average of
            `ParamDict.from_module(model, buffers=True)`).
        module: The module the values belong to; unchanged.
        loader: Batches of inputs.
        device: Move each input there first.

    Returns:
        A new ParamDict, keyed like `values`.

    Raises:
        ValueError: If a key names nothing in `module` or a shape differs.

    Example:
        >>> from paramdict import optim
        >>> model = torch.nn.BatchNorm1d(1)
        >>> values = ParamDict.from_module(model, buffers=True)
        >>> loader = [torch.tensor([[1.0], [3.0]])]
        >>> optim.update_bn(values, model, loader)["running_mean"]
        tensor([2.])
    """
    copied = copy.deepcopy(module)
    values.to_module(copied, strict=False)
    torch.optim.swa_utils.update_bn(loader, copied, device=device)
    refreshed = ParamDict.from_module(copied, buffers=True)
    return ParamDict((k, refreshed[k].detach().clone()) for k in values)


def _flagged(made: list[Tensor], averages: list[Tensor]) -> list[Tensor]:
    """`made`, each a leaf requiring grad where its old average did."""
    for new, old in zip(made, averages, strict=True):
        if old.requires_grad and not new.requires_grad:
            new.requires_grad_()
    return made
