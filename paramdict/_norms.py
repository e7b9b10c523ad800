"""Normalization layers under `torch.func.vmap`: refuse what torch gets silently wrong.

torch 2.13's vmap rules for the batch-norm and layer-norm backward compute the
weight's gradient from the mean and inverse deviation that the forward saved, and
those carry no autograd history. When that backward runs inside a vmap (a
`torch.func.grad` mapped over tasks, MAML's inner step) and something below the
vmap differentiates it again (ordinary autograd taking the meta-gradient, or an
outer `torch.func.grad`), the statistics' dependence on the input is dropped: the
second-order meta-gradient comes out wrong, with no error. First order is right
(nothing differentiates the backward again: per-sample gradients, first-order
MAML), so are the same steps without vmap (the per-task loop), eval-mode batch
norm (its statistics are the running ones), layers without an affine weight, and
group norm and RMS norm (whose rules keep the history).

`watched` is what `ParamDict.call` consults: outside vmap it costs one look at
functorch's (empty) transform stack. Under a vmap it returns a `_Watch` that runs
the module's forward under a `TorchFunctionMode` which sees every call of
`F.batch_norm`, `F.instance_norm`, `F.layer_norm` and their `torch.*` forms, so
modules that call them directly are covered as well as the `nn` layers. Where the
backward would be differentiated again, it passes the norm's input and weight
through `_Guard`, an identity whose backward is an identity too, but whose result
there (the inner gradient) raises when differentiated: the refusal comes when the
double backward runs, and first-order use is untouched (bitwise, one copy of the
input and weight). It also turns torch's errors about running statistics updated
in place under vmap into one that says what to do. Not covered: code that calls
these functions outside `call` (`torch.func.functional_call`, a hand-written
functional forward, a module run inside `swapped_into`), `call` under
`torch.compile` (which traces `functional_call`), and the `torch.ops.aten` kernels
called directly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import torch
import torch._C._functorch  # typed by torch, but only as a named submodule
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

__all__: list[str] = []

_functorch = torch._C._functorch
_VMAP = _functorch.TransformType.Vmap
_GRAD = _functorch.TransformType.Grad

SECOND_ORDER_UNDER_VMAP: Final = (
    "`call`: a gradient computed inside `torch.func.vmap` through {what}, which "
    "normalizes with statistics of its input, is being differentiated again (a "
    "second-order step, as in MAML). torch's vmap rule for the `{op}` backward "
    "treats the mean and variance as constants there, so this derivative would "
    "be silently wrong. Run the tasks in a Python loop, "
    "`params.grad(loss, create_graph=True)` per task (the same meta-gradient, "
    "computed correctly). Using the vmapped gradients first order (first-order "
    "MAML, per-sample gradients) needs no change; to say so, run the vmapped "
    "`torch.func.grad` under `torch.no_grad()`, or give it `params.detach()`, "
    "and nothing is recorded to differentiate.{eval_hint}"
)
"""The error for a norm layer's backward that vmap would differentiate wrongly.

Wrong: `vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)` with grad mode on
and `params` requiring grad, where `loss` runs a BatchNorm in training mode (or a
LayerNorm, or an affine InstanceNorm), and then a gradient of the result with
respect to `params` (raised then, by the double backward). Why: the vmap rule for
the backward drops the batch statistics' dependence on the input. Fix: the
per-task loop with `params.grad(loss, create_graph=True)`, or a first-order step.
"""

_EVAL_HINT: Final = (
    " A BatchNorm in eval mode that tracks running statistics normalizes with "
    "those and is fine under vmap."
)

RUNNING_STATS_UNDER_VMAP: Final = (
    "`call`: {what} would update running statistics in place (BatchNorm in "
    "training mode with `track_running_stats=True`), which torch cannot do under "
    "`torch.func.vmap` with statistics that are not batched like the input. "
    "Build the layer with `track_running_stats=False` (it then normalizes with "
    "batch statistics in eval mode too), or call "
    "`torch.func.replace_all_batch_norm_modules_(model)` to do that to every "
    "BatchNorm in place; or pass per-task running statistics through `call` "
    "(buffers from `ParamDict.from_module(model, buffers=True)`, stacked and "
    "mapped with `in_dims=0`); or run the tasks in a Python loop. A second-order "
    "step through a BatchNorm in training mode needs the loop in any case: under "
    "vmap torch gets that meta-gradient wrong."
)
"""The error for running statistics updated in place under vmap.

Wrong: `vmap(loss, in_dims=(None, 0, 0))(params, x, y)` where `loss` runs a
default `nn.BatchNorm2d` in training mode. Why: the layer writes the batch mean
of every task into one unbatched `running_mean`. Fix: `track_running_stats=False`
or `torch.func.replace_all_batch_norm_modules_`, batched buffers, or a loop.
"""


class _Refuse(torch.autograd.Function):
    """An identity that raises when differentiated: `message` says why."""

    generate_vmap_rule = True

    @staticmethod
    def forward(value: Tensor, message: str) -> Tensor:  # pyright: ignore[reportIncompatibleMethodOverride]  # torch's stub takes `*args: Any`
        return value.clone()

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.message = inputs[1]

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:  # pyright: ignore[reportIncompatibleMethodOverride]  # torch's stub takes `*grad_outputs: Any`
        raise ValueError(ctx.message)


class _Guard(torch.autograd.Function):
    """An identity whose backward hands on the gradient through `_Refuse`.

    Applied to a norm's input and weight inside the vmapped `torch.func.grad`:
    the inner gradient passes it unchanged, and a later differentiation of
    that gradient (the double backward vmap gets wrong) raises `message`.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(value: Tensor, message: str) -> Tensor:  # pyright: ignore[reportIncompatibleMethodOverride]  # torch's stub takes `*args: Any`
        return value.clone()

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
        ctx.message = inputs[1]

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor | None, ...]:  # pyright: ignore[reportIncompatibleMethodOverride]  # torch's stub takes `*grad_outputs: Any`
        return _Refuse.apply(grads[0], ctx.message), None  # type: ignore[no-untyped-call]  # torch leaves `Function.apply` untyped


class _Norm:
    """Where one normalization function keeps its arguments.

    Attributes:
        op: The name used in messages.
        names: Positional parameter names, in order (up to the last one read).
        defaults: Values of parameters that may be left out.
        stats: The parameter that says whether batch statistics are used (`None`:
            always, as for layer norm).
        running: Whether the function can update running statistics in place.
    """

    __slots__ = ("defaults", "names", "op", "running", "stats")

    def __init__(
        self,
        op: str,
        names: tuple[str, ...],
        defaults: Mapping[str, object],
        *,
        stats: str | None,
        running: bool,
    ) -> None:
        self.op = op
        self.names = names
        self.defaults = defaults
        self.stats = stats
        self.running = running

    def arg(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        """Return the argument `name` of a call: by position, keyword or default."""
        if name in kwargs:
            return kwargs[name]
        index = self.names.index(name)
        if index < len(args):
            return args[index]
        return self.defaults.get(name)

    def replaced(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], new: Mapping[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        """Return the call's arguments with those named in `new` replaced."""
        args, kwargs = list(args), dict(kwargs)
        for name, value in new.items():
            index = self.names.index(name)
            if name in kwargs or index >= len(args):
                kwargs[name] = value
            else:
                args[index] = value
        return args, kwargs


_F_BATCH = ("input", "running_mean", "running_var", "weight", "bias", "training")
_T_BATCH = ("input", "weight", "bias", "running_mean", "running_var", "training")
_F_INSTANCE = (*_F_BATCH[:5], "use_input_stats")
_T_INSTANCE = (*_T_BATCH[:5], "use_input_stats")
_LAYER = ("input", "normalized_shape", "weight")
_NONE: Final[Mapping[str, object]] = {}

_NORMS: Final[dict[Callable[..., Any], _Norm]] = {
    F.batch_norm: _Norm(
        "batch_norm", _F_BATCH, {"training": False}, stats="training", running=True
    ),
    torch.batch_norm: _Norm(
        "batch_norm", _T_BATCH, _NONE, stats="training", running=True
    ),
    torch.native_batch_norm: _Norm(
        "batch_norm", _T_BATCH, _NONE, stats="training", running=True
    ),
    F.instance_norm: _Norm(
        "instance_norm",
        _F_INSTANCE,
        {"use_input_stats": True},
        stats="use_input_stats",
        running=True,
    ),
    torch.instance_norm: _Norm(
        "instance_norm", _T_INSTANCE, _NONE, stats="use_input_stats", running=True
    ),
    F.layer_norm: _Norm("layer_norm", _LAYER, _NONE, stats=None, running=False),
    torch.layer_norm: _Norm("layer_norm", _LAYER, _NONE, stats=None, running=False),
    torch.native_layer_norm: _Norm(
        "layer_norm", _LAYER, _NONE, stats=None, running=False
    ),
}
"""The functions watched, each with where it keeps its arguments."""


def _tracked_levels(tensor: Tensor) -> tuple[list[int], bool]:
    """Return the functorch levels that track `tensor` for grad, and its base's flag.

    The levels are those of the gradient-tracking wrappers around it that require
    grad; the flag is whether the plain tensor under all wrappers requires grad
    (ordinary autograd records it).
    """
    levels: list[int] = []
    while _functorch.is_functorch_wrapped_tensor(tensor):
        if not _functorch.is_batchedtensor(tensor) and tensor.requires_grad:
            levels.append(_functorch.maybe_get_level(tensor))
        tensor = _functorch.get_unwrapped(tensor)
    return levels, tensor.requires_grad


_TRACKING = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)


def _tracking_norms(module: nn.Module) -> dict[str, nn.Module]:
    """Return the layers that would update unbatched running statistics in place.

    Those are BatchNorm and InstanceNorm layers in training mode that track
    running statistics, unless the statistics they hold are batched (per-task
    buffers given to `call` under vmap); keyed by their names in `module`.
    """
    found: dict[str, nn.Module] = {}
    for name, layer in module.named_modules():  # pyright: ignore[reportUnknownVariableType]  # named_modules is annotated loosely
        if not (
            isinstance(layer, _TRACKING)
            and layer.training
            and layer.track_running_stats
            and isinstance(layer.running_mean, Tensor)
        ):
            continue
        stats = layer.running_mean
        while _functorch.is_functorch_wrapped_tensor(stats):
            if _functorch.is_batchedtensor(stats):
                break
            stats = _functorch.get_unwrapped(stats)
        else:
            found[name] = layer
    return found


def _describe_layers(module: nn.Module, layers: Mapping[str, nn.Module]) -> str | None:
    """Name `layers` of `module` for a message; `None` when there are none."""
    if not layers:
        return None
    if list(layers) == [""]:
        return f"the module ({type(module).__name__})"
    named = sorted(
        f"{name!r} ({type(layer).__name__})" for name, layer in layers.items()
    )
    return f"the layer{'s' * (len(named) > 1)} " + ", ".join(named)


class _Watch(TorchFunctionMode):
    """Run a module's forward, refusing the norm calls vmap would get wrong."""

    def __init__(self, stack: Sequence[Any], names: Mapping[int, str]) -> None:
        super().__init__()
        grads = [i for i in stack if i.key() == _GRAD]
        self._vmaps = [i.level() for i in stack if i.key() == _VMAP]
        self._grads = {i.level() for i in grads}
        # Whether ordinary autograd records below every transform: the grad mode
        # the outermost `torch.func.grad` found when it started.
        self._records = (
            _functorch.CGradInterpreterPtr(grads[0]).prevGradMode()
            if grads
            else torch.is_grad_enabled()
        )
        self._names = names
        self._failed: str | None = None  # the norm call that failed to update

    def run(self, module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
        """Return `module(*args, **kwargs)`, computed under this watch."""
        tracking = _tracking_norms(module)
        counts = [
            (count, count.clone())
            for layer in tracking.values()
            if isinstance(count := layer.num_batches_tracked, Tensor)
        ]
        try:
            with self:
                return module(*args, **kwargs)
        except RuntimeError as err:
            # A BatchNorm counts its batches (`num_batches_tracked.add_(1)`)
            # before it normalizes, which fails under `torch.func.grad`; under
            # vmap alone the count goes up and the norm call fails (noted in
            # `_failed`). Either way the module keeps the counts it had.
            with torch.no_grad():
                for count, saved in counts:
                    if not torch.equal(count, saved):  # no in-place op if unchanged
                        count.copy_(saved)
            what = _describe_layers(module, tracking) or self._failed
            if what is None:
                raise
            msg = RUNNING_STATS_UNDER_VMAP.format(what=what)
            raise ValueError(msg) from err

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        norm = _NORMS.get(func)
        if norm is None:
            return func(*args, **kwargs)
        batch_stats = norm.stats is None or bool(norm.arg(norm.stats, args, kwargs))
        weight = norm.arg("weight", args, kwargs)
        if batch_stats and isinstance(weight, Tensor):
            message = self._second_order(norm, norm.arg("input", args, kwargs), weight)
            if message is not None:
                guarded: dict[str, Tensor] = {
                    name: _Guard.apply(norm.arg(name, args, kwargs), message)  # type: ignore[no-untyped-call]  # torch leaves `Function.apply` untyped
                    for name in ("input", "weight")
                }
                args, kwargs = norm.replaced(args, kwargs, guarded)
        running = norm.arg("running_mean", args, kwargs) if norm.running else None
        try:
            return func(*args, **kwargs)
        except RuntimeError:
            if batch_stats and isinstance(running, Tensor):
                self._failed = self._describe(norm, running, "running_mean")
            raise

    def _second_order(self, norm: _Norm, input: Any, weight: Tensor) -> str | None:
        """Return the error if vmap would run this norm's backward and autograd redo it.

        That is: the weight is tracked by a `torch.func.grad` inside a vmap (so
        the backward under vmap computes the weight's gradient), and the input is
        differentiated below that vmap (by ordinary autograd or an outer grad).
        `None` when nothing below would differentiate the backward again.
        """
        inner = [level for level in _tracked_levels(weight)[0] if level in self._grads]
        below = [v for v in self._vmaps if inner and v < max(inner)]
        if not below or not isinstance(input, Tensor):
            return None
        levels, base_requires_grad = _tracked_levels(input)
        recorded = self._records and base_requires_grad
        if recorded or any(v in self._grads and v < max(below) for v in levels):
            what = self._describe(norm, weight, "weight")
            hint = _EVAL_HINT if norm.op == "batch_norm" else ""
            return SECOND_ORDER_UNDER_VMAP.format(what=what, op=norm.op, eval_hint=hint)
        return None

    def _describe(self, norm: _Norm, tensor: Tensor, slot: str) -> str:
        """Name the layer by the key of its `slot` tensor, if `call` was given it."""
        key = self._names.get(id(tensor))
        if key is None:
            return f"a `{norm.op}` call"
        if key == slot:
            return f"the module's `{norm.op}`"
        if key.endswith("." + slot):
            return f"the layer {key[: -len(slot) - 1]!r} (`{norm.op}`)"
        return f"the `{norm.op}` given {key!r}"


def watched(module: nn.Module, values: Mapping[str, Tensor]) -> Callable[..., Any]:
    """Return `module`, or under vmap a function that runs it under the watch.

    Args:
        module: The module `call` runs.
        values: The tensors `call` puts into it, by key (to name a layer).

    Returns:
        `module` itself when no `torch.func.vmap` is running (nothing to check);
        else a function of the forward's arguments that runs `module` with the
        norm calls watched.
    """
    # Annotated as never None, but None when no transform runs.
    if _functorch.peek_interpreter_stack() is None:  # pyright: ignore[reportUnnecessaryComparison]
        return module
    stack = _functorch.get_interpreter_stack()
    if not any(i.key() == _VMAP for i in stack):
        return module
    from ._module import _slots  # `_module` loads this module when it runs

    # Through the slots, not `named_parameters(remove_duplicate=False)`: that walk
    # never ends on a module that holds one of its ancestors.
    names = {id(held[name]): key for key, (held, name) in _slots(module).items()}
    names.update((id(tensor), key) for key, tensor in values.items())
    return functools.partial(_Watch(stack, names).run, module)
