"""Which path a step takes: one table, and the one function that reads it.

Every optimizer step runs one of five paths. `choose` decides, testing each
row's condition in this order, and the first row that holds is taken:

- `RECORDED` (`step`): `differentiable=True`. The rule on `RecordedKernels`,
  under autograd. (`step_` refused it before: `_writable.check_writable`.)
- `TRACED` (`step`, `step_`): `torch.compile` traces the step, or (`step`) a
  `torch.func` transform runs it. The rule on the functional `Kernels`, with no
  host-side plan; `step_` copies the results into its tensors
  (`_writable.write_back`). (`step_` under a transform was refused before.)
- `FUSED_COPIES` (`step`): eager; the class's `_copies_pay` or its `fused` flag;
  its `_fused_rates` gives the rates as the kernel takes them
  (`_fused.fused_rates`: `fused` not False, one float dtype and one device the
  kernel has, no DTensors, a number `weight_decay`, and an `lr` that is a
  number, a schedule on the CPU, or a 0-dim tensor: on the CPU read as the
  float the kernel's `.tensor_lr` overload reads, the same bytes; off the CPU
  float32 on the entries' device, handed to that overload). torch's fused
  kernel on fresh copies laid out for it (`_layout.fused_copies`), so any
  layout qualifies.
- `FUSED` (`step_`): eager; `_fused_rates` gives the rates, as above; and
  `_layout.not_writable_by_kernel` finds every parameter dense and every buffer
  of its parameter's strides (a gradient of other strides is copied:
  `_layout.in_place_grads`). A layout that fails this takes the next row, or is
  refused under `fused=True`, naming the keys. (The conditions on the entries
  alone are met once per kept record of `step_`: `_repeat`; the rates are read
  on every call.)
- `RULE` (`step`, `step_`): otherwise. The rule on `InPlaceKernels` (in `step`
  owning nothing, so it writes only into the tensors it made).

A new fast path is a row here, with its conditions in `choose`: nothing else
picks a path. The wrappers (`ParamGroups`, `ClipGradNorm`, `MultiSteps`) ask
`one_graph` whether their step is one functional graph (the first two rows) or
is handed on to the optimizers they hold, which choose for themselves.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch._C._functorch  # typed by torch, but only as a named submodule

from ._layout import not_writable_by_kernel
from ._repeat import kept

if TYPE_CHECKING:
    from .._paramdict import ParamDict
    from ._fused import KernelRates
    from ._protocol import Optimizer

__all__ = ["Choice", "Path", "choose", "one_graph", "traced", "transformed"]


class Path(enum.Enum):
    """The paths a step can take (rows of the module's table)."""

    RECORDED = "the rule under autograd"
    TRACED = "the rule on the functional kernels, traced"
    FUSED_COPIES = "torch's fused kernel on copies"
    FUSED = "torch's fused kernel, in place"
    RULE = "the rule on the in-place kernels"


class Choice(NamedTuple):
    """A path, and for the fused ones the kernel's rates."""

    path: Path
    rates: KernelRates | None = None


def transformed() -> bool:
    """Whether a `torch.func` transform (`vmap`, `grad`, ...) runs the caller."""
    # Annotated as never None, but None when no transform runs.
    return torch._C._functorch.peek_interpreter_stack() is not None  # pyright: ignore[reportUnnecessaryComparison, reportPrivateUsage]


def traced() -> bool:
    """Whether `torch.compile` or a `torch.func` transform runs the caller."""
    return torch.compiler.is_compiling() or transformed()


def one_graph(opt: Optimizer[Any]) -> Path | None:
    """Return `RECORDED` or `TRACED` where `step` is one graph of `update`, else None.

    Example:
        >>> from paramdict import optim
        >>> one_graph(optim.SGD(differentiable=True)), one_graph(optim.SGD())
        (<Path.RECORDED: 'the rule under autograd'>, None)
    """
    if opt.differentiable:
        return Path.RECORDED
    return Path.TRACED if traced() else None


_RECORDED = Choice(Path.RECORDED)
_TRACED = Choice(Path.TRACED)
_RULE = Choice(Path.RULE)


def choose(
    opt: Optimizer[Any], params: ParamDict, state: object, *, in_place: bool
) -> Choice:
    """Return the path of a step of `opt` on `params` and `state` (the table's row).

    Args:
        opt: The optimizer stepping.
        params: The checked parameters (not empty).
        state: Their checked state.
        in_place: True for `step_` (and `step_module`), False for `step`.

    Returns:
        The first row of the table whose conditions hold, with the fused
        kernel's rates on the fused rows.

    Raises:
        ValueError: Under `fused=True`, if the kernel cannot take the step
            (`_fused.fused_rates`) or, in place, cannot write into the keys
            named (their layout).

    Example:
        >>> from paramdict import ParamDict, optim
        >>> params = ParamDict(w=torch.zeros(3, 2))
        >>> opt = optim.Adam(lr=0.1)
        >>> state = opt.init(params)
        >>> choice = choose(opt, params, state, in_place=True)
        >>> choice.path
        <Path.FUSED: "torch's fused kernel, in place">
        >>> choice.rates
        KernelRates(lr=0.1, weight_decay=0.0)
        >>> tensor_lr = optim.Adam(lr=torch.tensor(0.1))  # float32, on the CPU
        >>> choose(tensor_lr, params, state, in_place=True).rates
        KernelRates(lr=0.10000000149011612, weight_decay=0.0)
        >>> choose(opt, ParamDict(w=torch.zeros(2, 3).t()), state, in_place=True).path
        <Path.RULE: 'the rule on the in-place kernels'>
    """
    if opt.differentiable:
        return _RECORDED
    if torch.compiler.is_compiling() or (not in_place and transformed()):
        return _TRACED
    if not in_place and not (opt._copies_pay or getattr(opt, "fused", None)):  # pyright: ignore[reportPrivateUsage]  # the optimizers' own
        return _RULE
    rates: KernelRates | None = opt._fused_rates(params, state)  # pyright: ignore[reportPrivateUsage]
    if rates is None:
        return _RULE
    if not in_place:
        return Choice(Path.FUSED_COPIES, rates)
    # A pure function of the layouts: once while `step_` gets them back.
    blocked = kept(
        params, state, "layout", lambda: not_writable_by_kernel(params, state)
    )
    if not blocked:
        return Choice(Path.FUSED, rates)
    if getattr(opt, "fused", None):
        msg = (
            f"`{type(opt).__name__}(fused=True)` cannot write the step into "
            f"{blocked!r} with torch's fused kernel: their parameters are not "
            "dense (a slice with a step, an `expand`) or their state buffers "
            "are laid out otherwise (other strides). Pass `fused=None` to "
            "take the foreach kernels for such steps, or give each entry "
            "and its buffers one dense layout (`.contiguous()`)."
        )
        raise ValueError(msg)
    return _RULE
