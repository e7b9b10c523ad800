"""Hyperparameters: the `Rate` type, their validation, and the arithmetic on them.

Step-dependent scalars (bias corrections, decayed rates) are 0-dim double-precision
tensors computed from the step counter, the numbers torch computes with Python floats.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from numbers import Real
from typing import Any, TypeAlias, TypeVar, cast

import torch
import torch._C._functorch  # typed by torch, but only as a named submodule
from torch import Tensor

from .._container import key_mismatch_message
from .._foreach import holds_dtensors
from .._paramdict import ParamDict

__all__ = [
    "Rate",
    "check_betas",
    "check_count",
    "check_flag",
    "check_fraction",
    "check_fused",
    "check_int",
    "check_non_negative",
    "check_number",
    "check_number_in",
    "check_optional_flag",
    "check_optional_number",
    "check_rate",
    "check_rate_keys",
    "check_rate_shapes",
    "compute_dtype",
    "decay_factor",
    "host_numbers",
    "is_finite",
    "is_int_or_float",
    "is_zero",
    "new_counter",
    "product",
    "quotient",
    "state_scalar_dtype",
]

Rate: TypeAlias = float | Tensor | ParamDict
"""A number, a 0-dim tensor (may require grad), or a ParamDict of per-key values."""

P = TypeVar("P", bound=ParamDict)

Validator: TypeAlias = Callable[[object, Any, Any], None]


def _is_number(value: object) -> bool:
    return type(value) is not bool and isinstance(value, Real)


def is_int_or_float(value: object) -> bool:
    """Whether `value` is an int or a float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_number(instance: object, attribute: Any, value: Any) -> None:
    """Raise `TypeError` unless `value` is a real number (not a bool)."""
    if not _is_number(value):
        msg = f"`{attribute.name}` must be a number, got {type(value).__name__}."
        raise TypeError(msg)


def check_non_negative(instance: object, attribute: Any, value: Any) -> None:
    """Raise unless `value` is a finite number `>= 0`, naming the argument."""
    check_number(instance, attribute, value)
    if not value >= 0:
        msg = f"`{attribute.name}` must be non-negative, got {value!r}."
        raise ValueError(msg)
    if not is_finite(attribute.name, value):
        msg = f"`{attribute.name}` must be finite, got {value!r}."
        raise ValueError(msg)


def is_finite(name: str, value: float) -> bool:
    """Return whether the number `value` is finite; refuse an int no float holds."""
    try:
        return math.isfinite(value)
    except OverflowError:
        msg = (
            f"`{name}` is too large for a float (an int of {len(str(value))} "
            "digits); torch computes with floats. Give a value below 1e308."
        )
        raise ValueError(msg) from None


def check_optional_flag(instance: object, attribute: Any, value: Any) -> None:
    """Raise `TypeError` unless `value` is None, True or False, naming the argument."""
    if value is not None and not isinstance(value, bool):
        msg = f"`{attribute.name}` must be None, True or False, got {value!r}."
        raise TypeError(msg)


def check_fused(instance: object, attribute: Any, value: Any) -> None:
    """Raise unless `fused` is None or a bool, and True only if not differentiable."""
    check_optional_flag(instance, attribute, value)
    if value and getattr(instance, "differentiable", False):
        msg = (
            "`fused=True` needs `differentiable=False`: torch's fused kernels "
            "write in place, outside autograd. Leave `fused` at None."
        )
        raise ValueError(msg)


def check_betas(count: int) -> Validator:
    """Return the validator of `count` (2 or 3) numbers, each in `[0, 1)`."""
    what = "a pair of numbers" if count == 2 else "three numbers"

    def check(instance: object, attribute: Any, value: Any) -> None:
        given = cast("tuple[object, ...]", value) if isinstance(value, tuple) else ()
        if len(given) != count or not all(map(_is_number, given)):
            msg = f"`{attribute.name}` must be {what}, got {value!r}."
            raise TypeError(msg)
        for i, beta in enumerate(cast("tuple[float, ...]", given)):
            if not 0 <= beta < 1:
                msg = f"`{attribute.name}[{i}]` must be in [0, 1), got {beta!r}."
                raise ValueError(msg)

    return check


def check_rate(instance: object, attribute: Any, value: Any) -> None:
    """Raise unless `value` is a valid `Rate`, naming the argument.

    A tensor's value is read on the CPU only; a ParamDict's keys are checked by `init`.
    """
    name = attribute.name
    if isinstance(value, ParamDict):
        return
    if isinstance(value, Tensor):
        if value.dim() != 0:
            msg = (
                f"`{name}` must be a 0-dim tensor (one value for every entry), got "
                f"shape {tuple(value.shape)}. For per-entry values pass a ParamDict."
            )
            raise ValueError(msg)
        if not value.is_floating_point():
            msg = f"`{name}` must be a floating-point tensor, got {value.dtype}."
            raise TypeError(msg)
        if value.device.type == "cpu" and not is_traced(value):
            # One read, on the host only (as torch.optim reads it there).
            number = value.item()
            if not (math.isfinite(number) and number >= 0):
                msg = f"`{name}` must be finite and non-negative, got {value!r}."
                raise ValueError(msg)
        return
    if not _is_number(value):
        msg = (
            f"`{name}` must be a number, a 0-dim tensor or a ParamDict of per-key "
            f"values, got {type(value).__name__}."
        )
        raise TypeError(msg)
    check_non_negative(instance, attribute, value)


def check_rate_keys(params: ParamDict, name: str, rate: Rate) -> None:
    """Raise `ValueError` if `rate` is a ParamDict whose keys are not `params`'."""
    if isinstance(rate, ParamDict) and set(rate) != set(params):
        msg = key_mismatch_message(
            tuple(params),
            rate.keys(),
            what=f"`{name}` (per-key values) and the params",
            fix=f"Give `{name}` exactly one value per parameter.",
        )
        raise ValueError(msg)


def is_zero(rate: Rate) -> bool:
    """Return whether `rate` is the number zero (a tensor is never known to be)."""
    return _is_number(rate) and bool(rate == 0)


def quotient(
    rate: Rate, divisor: Tensor, *, negated: bool = False
) -> Tensor | ParamDict:
    """Return `rate / divisor` (negated: `-(rate / divisor)`) for a 0-dim `divisor`."""
    if isinstance(rate, ParamDict):
        return rate.div(divisor).neg() if negated else rate.div(divisor)
    if isinstance(rate, Tensor):
        # torch.optim divides a tensor rate by a Python float: in the rate's dtype.
        result = rate / divisor.to(rate.dtype)
        return result.neg() if negated else result
    # `number / tensor` would be `reciprocal(tensor) * number`, rounded twice. A
    # 0-dim host tensor is a scalar operand beside a device one: no fill kernel.
    numerator = torch.tensor(-rate if negated else rate, dtype=divisor.dtype)
    return torch.div(numerator, divisor)


def product(rate: Rate, factor: Tensor) -> Tensor | ParamDict:
    """Return `rate * factor` for a 0-dim `factor`, rounded as `torch.optim` does."""
    if isinstance(rate, ParamDict):
        return rate.mul(factor)
    if isinstance(rate, Tensor):
        return rate * factor.to(rate.dtype)
    return factor * rate


def decay_factor(lr: Rate, weight_decay: Rate) -> Rate:
    """Return `1 - lr * weight_decay`, the decoupled (AdamW) decay multiplier."""
    if isinstance(weight_decay, ParamDict):
        return 1 - weight_decay.mul(lr)
    if isinstance(lr, ParamDict):
        return 1 - lr.mul(weight_decay)
    return 1 - lr * weight_decay


def compute_dtype(params: ParamDict) -> torch.dtype | None:
    """Return the dtype all entries share when it is `float32` or `float64`, else None.

    Scalars of that dtype (see `Kernels.scalar`) take torch's faster foreach path.
    """
    dtypes = {v.dtype for v in params._vals}
    dtype = dtypes.pop() if len(dtypes) == 1 else None
    return dtype if dtype in (torch.float32, torch.float64) else None


def new_counter() -> Tensor:
    """Return a 0-dim zero step counter on the host, as `torch.optim` keeps it.

    A tensor, so that `torch.compile` does not specialize on it.
    """
    return torch.zeros((), dtype=torch.float64)


def device_counter(params: ParamDict) -> Tensor:
    """Return a 0-dim zero step counter on the parameters' device (`capturable`)."""
    first = next(iter(params.values()), None)
    if first is None or first.device.type == "cpu":
        return new_counter()
    dtype = state_scalar_dtype(first.device)
    if holds_dtensors([first]):  # a plain tensor beside DTensors, as torch's
        return torch.zeros((), dtype=dtype, device=first.device)
    return first.new_zeros((), dtype=dtype)  # fake and meta stay so


def check_device_counter(counter: Tensor, params: ParamDict, field: str) -> None:
    """Raise unless `counter` is on the parameters' device (`capturable=True`)."""
    first = next(iter(params.values()), None)
    if first is None or first.device.type == "cpu" or counter.device == first.device:
        return
    msg = (
        f"The state's `{field}` is on {counter.device}, and `capturable=True` keeps "
        f"it on the parameters' device ({first.device}), so that a step reads no "
        "number on the host. Use the state from this optimizer's `init`, or build "
        "the optimizer with `capturable=False`."
    )
    raise ValueError(msg)


def state_scalar_dtype(device: torch.device) -> torch.dtype:
    """Return the dtype `torch.optim` keeps per-parameter scalar state in.

    NAdam's `mu_product` and ASGD's `eta` and `mu`: single precision unless the
    default dtype is `float64`, whose rounding a float64 copy would drift from.
    """
    if device.type == "mps" or torch.get_default_dtype() != torch.float64:
        return torch.float32
    return torch.float64


def is_traced(tensor: Tensor) -> bool:
    """Return whether `tensor`'s value cannot be read: compiled, transformed, meta."""
    return (
        torch.compiler.is_compiling()
        or tensor.is_meta
        or torch._C._functorch.is_functorch_wrapped_tensor(tensor)
        or (type(tensor) is not Tensor and not isinstance(tensor, torch.nn.Parameter))
    )


def host_numbers(
    differentiable: bool, *values: float | Tensor | ParamDict
) -> tuple[float, ...] | None:
    """`values` as Python floats where torch.optim reads its scalars on the host.

    See `ScheduledRate.host_numbers`; `differentiable` keeps a value that requires
    grad a tensor (None).
    """
    numbers: list[float] = []
    for value in values:
        if isinstance(value, ParamDict):
            return None
        if isinstance(value, Tensor):
            if (
                value.device.type != "cpu"
                or is_traced(value)
                or (differentiable and value.requires_grad)
            ):
                return None
            numbers.append(value.item())
        else:
            numbers.append(float(value))
    return tuple(numbers)


def check_counter(
    counter: object,
    params: ParamDict,
    field: str,
    *,
    dtype: torch.dtype | None = None,
) -> None:
    """Raise unless `counter` is a state's count: 0-dim, its dtype, a whole number >= 0.

    `dtype` defaults to float64 (float32 on MPS, which has no doubles). The value
    is read eagerly on the CPU only.
    """
    what = f"The state's `{field}`"
    fix = "Use the state from this optimizer's `init` (or a checkpoint of it)."
    if not (isinstance(counter, Tensor) and counter.dim() == 0):
        msg = f"{what} must be a 0-dim tensor, got {counter!r}. {fix}"
        raise TypeError(msg)
    first = next(iter(params.values()), None)
    device = first.device if first is not None else counter.device
    default = torch.float32 if device.type == "mps" else torch.float64
    expected = default if dtype is None else dtype
    if dtype is None and counter.device.type == "cpu":
        expected = torch.float64
    if counter.dtype != expected:
        msg = f"{what} must be a {expected} tensor, got {counter.dtype}. {fix}"
        raise TypeError(msg)
    if counter.device.type != "cpu" and counter.device != device:
        msg = (
            f"{what} is on {counter.device}, the parameters on {device}. Keep the "
            "counter on the CPU (where `init` makes it) or move the state to the "
            "parameters' device (`state.to(...)`)."
        )
        raise ValueError(msg)
    if counter.device.type != "cpu" or is_traced(counter):
        return
    value = counter.item()
    if not (math.isfinite(value) and value >= 0 and value == int(value)):
        msg = f"{what} must be a whole number >= 0, got {value}. {fix}"
        raise ValueError(msg)


def check_rate_shapes(params: ParamDict, name: str, rate: ParamDict) -> None:
    """Raise unless each per-key rate broadcasts to its parameter, no wider dtype."""
    bad: list[str] = []
    for key, p in params.items():
        r = rate[key]
        if r.dtype.is_complex or not r.dtype.is_floating_point:
            bad.append(key)
            continue
        fits = r.dim() <= p.dim() and all(
            n in (1, m) for n, m in zip(reversed(r.shape), reversed(p.shape))
        )
        same_kind = r.dim() == 0 and p.dim() > 0  # a 0-dim rate takes the dtype of p
        if not fits or (
            not same_kind and torch.promote_types(p.dtype, r.dtype) != p.dtype
        ):
            bad.append(key)
    if bad:
        bad.sort()
        msg = (
            f"The per-key `{name}` values for {bad!r} would change the shape or dtype "
            "of their parameters; give each a real floating-point tensor whose "
            "shape broadcasts to its parameter's (0-dim, or the parameter's shape) "
            "and no wider dtype."
        )
        raise ValueError(msg)


def check_number_in(
    within: Callable[[Any], bool], wanted: str, *, integer: bool = False
) -> Validator:
    """Return the validator of a number (`integer`: an int; no bool) `within` takes."""
    kind, real = ("an int", int) if integer else ("a number", Real)

    def check(instance: object, attribute: Any, value: Any) -> None:
        if type(value) is bool or not isinstance(value, real):
            msg = f"`{attribute.name}` must be {kind}, got {type(value).__name__}."
            raise TypeError(msg)
        if not within(value):
            msg = f"`{attribute.name}` must be {wanted}, got {value!r}."
            raise ValueError(msg)

    return check


def check_int(within: Callable[[int], bool], wanted: str) -> Validator:
    """Return the validator of an int (not a bool) that `within` accepts."""
    return check_number_in(within, wanted, integer=True)


check_count = check_int(lambda n: n >= 1, "at least 1")
check_fraction = check_number_in(lambda x: 0 <= x <= 1, "in [0, 1]")


def check_optional_number(within: Callable[[float], bool], wanted: str) -> Validator:
    """Return the validator of None or an int or float `within` accepts."""
    in_range = check_number_in(within, wanted)

    def check(instance: object, attribute: Any, value: Any) -> None:
        if value is None:
            return
        if type(value) not in (int, float):
            msg = f"`{attribute.name}` must be None or a number, got {value!r}."
            raise TypeError(msg)
        in_range(instance, attribute, value)

    return check


def check_flag(instance: object, attribute: Any, value: Any) -> None:
    """Raise `TypeError` unless `value` is True or False, naming the argument."""
    if not isinstance(value, bool):
        msg = f"`{attribute.name}` must be True or False, got {value!r}."
        raise TypeError(msg)
