"""The optimizers as fuzzing tables: hostile options, parameters, gradients, states.

`OPTIMIZERS` names every optimizer of the library with a configuration that uses
most of its options, the parameters it takes (Muon: matrices) and, where
torch.optim has it, torch's class. From them:

- `constructor_args(cls)`: one `Arg` per option of the constructor, each with a
  valid value (and left out) and the hostile kinds of its type; an error about
  one must name the option.
- `state_arg(...)`: the state from `init` (valid) and, for each field of the
  state NamedTuple, its hostile stand-ins (`None`, a string, a NaN or negative
  count, a 0-dim tensor where a buffer was and back, zero-size, meta, sparse,
  complex, other dtypes, a plain dict where a ParamDict or the NamedTuple is,
  an alias of the parameters); an error about one must name the field.
- `torch_step(...)`: torch's answer for one step from a state, through the
  checkpoint functions (the state exported, torch's optimizer stepped).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import attrs
import numpy as np
import torch
from _torch_versions import torch_at_least
from fuzz import OMIT, Arg, Built, Value, base, constant, entry_values
from torch import Tensor

from paramdict import ParamDict, optim

__all__ = [
    "OPTIMIZERS",
    "Spec",
    "check_readable",
    "constructor_args",
    "matrices",
    "opt_arg",
    "replaced",
    "state_arg",
    "torch_step",
]


def matrices(*, requires_grad: bool = False, shift: float = 0.0) -> ParamDict:
    """Muon's parameters: `{'w': (2, 3), 'b': (3, 2)}` (matrices only)."""
    return ParamDict(
        w=(torch.linspace(-1.0, 1.5, 6).reshape(2, 3) + shift).requires_grad_(
            requires_grad
        ),
        b=(torch.linspace(0.5, -2.0, 6).reshape(3, 2) + shift).requires_grad_(
            requires_grad
        ),
    )


@dataclass(frozen=True)
class Spec:
    """One optimizer: its class, a configuration, its parameters, torch's class."""

    name: str
    cls: type[Any]
    options: dict[str, Any]
    theirs: type[torch.optim.Optimizer] | None
    like: Callable[..., ParamDict] = base

    def make(self) -> optim.Optimizer[Any]:
        """Return the configured optimizer."""
        made: optim.Optimizer[Any] = self.cls(**self.options)
        return made


OPTIMIZERS: list[Spec] = [
    Spec(
        "SGD",
        optim.SGD,
        {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01},
        torch.optim.SGD,
    ),
    Spec("Adam", optim.Adam, {"lr": 0.1, "amsgrad": True}, torch.optim.Adam),
    Spec(
        "Adam-rule",
        optim.Adam,
        {"lr": 0.1, "weight_decay": 0.01, "fused": False},
        torch.optim.Adam,
    ),
    Spec("AdamW", optim.AdamW, {"lr": 0.1, "maximize": True}, torch.optim.AdamW),
    Spec(
        "RMSprop",
        optim.RMSprop,
        {"lr": 0.1, "centered": True, "momentum": 0.5},
        torch.optim.RMSprop,
    ),
    Spec("Adagrad", optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01}, torch.optim.Adagrad),
    Spec(
        "Adafactor",
        optim.Adafactor,
        {"lr": 0.1, "weight_decay": 0.01},
        torch.optim.Adafactor,
    ),
    # torch.optim.Muon came in torch 2.9: on an older torch, no reference.
    Spec(
        "Muon",
        optim.Muon,
        {"lr": 0.1},
        getattr(torch.optim, "Muon", None),
        like=matrices,
    ),
    Spec("NAdam", optim.NAdam, {"lr": 0.1, "momentum_decay": 0.01}, torch.optim.NAdam),
    Spec("RAdam", optim.RAdam, {"lr": 0.1, "weight_decay": 0.01}, torch.optim.RAdam),
    Spec("Adamax", optim.Adamax, {"lr": 0.1}, torch.optim.Adamax),
    Spec("Adadelta", optim.Adadelta, {"lr": 0.5, "rho": 0.8}, torch.optim.Adadelta),
    Spec("Rprop", optim.Rprop, {"lr": 0.1}, torch.optim.Rprop),
    Spec("ASGD", optim.ASGD, {"lr": 0.1, "t0": 1}, torch.optim.ASGD),
    Spec("Lion", optim.Lion, {"lr": 0.1, "weight_decay": 0.1}, None),
]


# ---------------------------------------------------------------- constructor options


def _bad(name: str, *pairs: tuple[str, Any]) -> tuple[Value, ...]:
    """Hostile values of option `name`: each error must name the option."""
    return tuple(
        Value(f"{name}={label}", constant(value), (f"`{name}`", name))
        for label, value in pairs
    )


_NOT_NUMBERS = (
    ("None", None),
    ("'0.5'", "0.5"),
    ("True", True),
    ("1j", 1j),
    ("[0.5]", [0.5]),
    ("a tensor (2,)", torch.ones(2)),
    ("a meta tensor", torch.tensor(0.5, device="meta")),
    ("an int tensor", torch.tensor(2)),
    ("a ParamDict", ParamDict(w=torch.ones(1))),
)
_BAD_NUMBERS = (
    ("nan", math.nan),
    ("inf", math.inf),
    ("-inf", -math.inf),
    ("-1.0", -1.0),
    ("1e308", 1e308),
    ("10**400", 10**400),
    ("a nan tensor", torch.tensor(math.nan)),
)


def _hostile_of(name: str, default: object) -> tuple[Value, ...]:
    """The hostile values of an option, by the kind of its default."""
    if isinstance(default, bool):
        return _bad(
            name,
            ("None", None),
            ("'yes'", "yes"),
            ("1", 1),
            ("nan", math.nan),
            ("a tensor", torch.tensor(True)),
        )
    if default is None or isinstance(default, str):
        return _bad(
            name,
            ("'unknown'", "unknown"),
            ("1", 1),
            ("True", True) if default is None else ("None", None),
            ("a tensor", torch.ones(1)),
        )
    if isinstance(default, tuple):
        return _bad(
            name,
            ("None", None),
            ("one number", 0.5),
            ("three numbers", (0.1, 0.2, 0.3)),
            ("a list", [0.1, 0.2]),
            ("nans", (math.nan, math.nan)),
            ("negatives", (-0.5, -0.5)),
            ("strings", ("a", "b")),
            ("a tensor pair", torch.tensor([0.1, 0.2])),
        )
    if isinstance(default, int):
        return _bad(
            name,
            *_NOT_NUMBERS[:3],
            ("-1", -1),
            ("1.5", 1.5),
            ("10**40", 10**40),
            ("nan", math.nan),
        )
    # A rate (`lr`, `weight_decay`) may be per key: a ParamDict is paramdict's
    # extension there, checked against the parameters when the optimizer meets
    # them, not a hostile value of the constructor.
    rate = name in ("lr", "weight_decay")
    numbers = [
        (label, v) for label, v in _NOT_NUMBERS if not (rate and label == "a ParamDict")
    ]
    return _bad(name, *numbers, *_BAD_NUMBERS)


def _valid_of(name: str, default: object) -> tuple[Value, ...]:
    """Valid values of an option: left out, and its default given explicitly.

    (Other values depend on each other: `nesterov=True` needs a momentum.)
    """
    return (
        Value(f"{name} left out", constant(OMIT)),
        Value(f"{name}={default!r}", constant(default)),
    )


def constructor_args(
    cls: type[Any], given: dict[str, Any] | None = None
) -> tuple[Arg, ...]:
    """One keyword `Arg` per option of `cls`'s constructor, valid and hostile.

    `given` holds the values of required options (and overrides of defaults that
    the other options need); an option whose value is neither a number, a flag,
    a string nor a tuple (a function, other schedules) is given as it is.
    """
    given = given or {}
    args = []
    for field in attrs.fields(cls):
        if not field.init or field.name.startswith("_"):
            continue
        if field.name in given:
            value = given[field.name]
            simple = value is None or isinstance(value, int | float | str | tuple)
            if not simple:
                args.append(
                    Arg(field.name, (Value(field.name, constant(value)),), keyword=True)
                )
                continue
            only = Value(f"{field.name}={value!r}", constant(value))
            hostile: tuple[Value, ...] = tuple(
                v for v in _hostile_of(field.name, value) if v.label != only.label
            )
            args.append(Arg(field.name, (only,), hostile, keyword=True))
            continue
        default = field.default
        if default is attrs.NOTHING:
            continue
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]  # attrs' own
            continue
        valid = _valid_of(field.name, default)
        hostile = _hostile_of(field.name, default)
        if field.name in ("lr", "weight_decay"):
            # A rate on the meta device stands in for one on an accelerator
            # (refused by the step when the parameters are elsewhere).
            hostile = tuple(v for v in hostile if "meta" not in v.label)
            # (A ParamDict of per-key rates is checked against the parameters'
            # keys by `init` and the steps: see `opt_arg`.)
            valid += (
                Value(f"{field.name}=0-dim tensor", lambda b: torch.tensor(0.05)),
            )
        args.append(Arg(field.name, valid, hostile, keyword=True))
    return tuple(args)


def _other_keys(spec: Spec, name: str) -> Callable[[Built], Any]:
    def build(b: Built) -> Any:
        made: Any = spec.make()
        return attrs.evolve(made, **{name: ParamDict(x=torch.tensor(0.01))})

    return build


def replaced(
    init: Callable[[Built], Any], field: str, make: Callable[[Built], Any]
) -> Callable[[Built], Any]:
    """A builder: the state `init(b)` with its `field` replaced by `make(b)`."""

    def build(b: Built) -> Any:
        return init(b)._replace(**{field: make(b)})

    return build


def _called(make: Callable[[], Any]) -> Callable[[Built], Any]:
    return lambda b: make()


def _field_of(init: Callable[[Built], Any], field: str) -> Callable[[Built], Any]:
    return lambda b: getattr(init(b), field)


def opt_arg(spec: Spec) -> Arg:
    """The optimizer: `spec`'s, or one whose per-key rates have other keys."""
    hostile = tuple(
        Value(
            f"{name}=ParamDict with other keys",
            _other_keys(spec, name),
            (f"`{name}`", "'x'"),
        )
        for name in ("lr", "weight_decay")
        if name in attrs.fields_dict(spec.cls)
    )
    return Arg("opt", (Value(spec.name, lambda b: spec.make()),), hostile)


# ---------------------------------------------------------------- states

# The buffers whose values may have either sign (the others hold squares or
# step sizes): there the parameters themselves are a state `step` can take.
_SIGNED = frozenset({"momentum_buffer", "exp_avg", "grad_avg", "prev", "ax"})


def _buffer_variants(
    field: str, like: Callable[[Built], ParamDict], key: str
) -> list[Value]:
    """A buffer keyed like the parameters, with one bad entry or of another kind."""
    names = (f"`{field}`", repr(key))
    kinds = (
        "0-dim",
        "one more dim",
        "zero-size",
        "wrong shape",
        "meta",
        "sparse",
        "complex64",
        "float64",
        "int64",
        "bool",
        "None",
        "float",
        "str",
    )
    out = [
        Value(f"{field}: {v.label}", v.build, names)
        for v in entry_values(like, kinds=kinds, keys=(key,))
    ]
    out += [
        Value(f"{field}=None", lambda b: None, (f"`{field}`",)),
        Value(f"{field}=a tensor", lambda b: torch.zeros(3), (f"`{field}`",)),
        Value(f"{field}=dict", lambda b: dict(like(b)), (f"`{field}`",)),
        Value(f"{field}='w'", lambda b: "w", (f"`{field}`",)),
        Value(
            f"{field} missing {key!r}",
            lambda b: like(b).exclude(key),
            (repr(key), f"`{field}`"),
        ),
        Value(
            f"{field} extra 'x'",
            lambda b: like(b) | {"x": torch.zeros(3)},
            ("'x'", f"`{field}`"),
        ),
    ]
    return out


_COUNTS = (
    ("-1", lambda: torch.tensor(-1.0, dtype=torch.float64)),
    ("nan", lambda: torch.tensor(math.nan, dtype=torch.float64)),
    ("inf", lambda: torch.tensor(math.inf, dtype=torch.float64)),
    ("1.5", lambda: torch.tensor(1.5, dtype=torch.float64)),
    ("float32", lambda: torch.tensor(1.0)),
    ("int64", lambda: torch.tensor(1)),
    ("meta", lambda: torch.zeros((), dtype=torch.float64, device="meta")),
    ("a vector", lambda: torch.zeros(2, dtype=torch.float64)),
    ("an int", lambda: 1),
    ("None", lambda: None),
    ("'1'", lambda: "1"),
    ("numpy", lambda: np.float64(1.0)),
)


def state_arg(spec: Spec, *, alias_ok: bool) -> Arg:
    """The `state` argument of `spec`'s optimizer: `init`'s, and each field bad.

    `alias_ok`: whether a buffer holding the parameters' own tensors is valid
    (`step`, which copies) or hostile (`step_`, which would write them twice).
    """
    opt = spec.make()
    first_params = spec.like()
    first = opt.init(first_params)

    def init(b: Built) -> Any:
        return b["opt"].init(spec.like())

    hostile: list[Value] = [
        Value("state=None", lambda b: None, ("state",)),
        Value("state=dict", lambda b: init(b)._asdict(), ("state", "dict")),
        Value("state=tuple", lambda b: tuple(init(b)), ("state", "tuple")),
        Value(
            "state=another optimizer's",
            lambda b: (
                optim.Lion().init(spec.like())
                if spec.name != "Lion"
                else optim.SGD().init(spec.like())
            ),
            ("state", "State"),
        ),
    ]
    valid = [Value("state=init", init)]
    for field, value in zip(first._fields, first):
        if field == "schedule":
            hostile.append(
                Value(
                    "schedule=a schedule state",
                    lambda b: init(b)._replace(
                        schedule=optim.StepLR(base_lr=0.1, step_size=2).init()
                    ),
                    ("`schedule`",),
                )
            )
            continue
        if isinstance(value, ParamDict) and value:
            key = next(iter(value))
            hostile += [
                Value(
                    v.label,
                    replaced(init, field, v.build),
                    v.blame,
                )
                for v in _buffer_variants(field, _field_of(init, field), key)
            ]
            same_keys = list(value) == list(first_params)
            alias = Value(
                f"{field}=the parameters",
                replaced(init, field, lambda b: b["params"]),
                () if alias_ok else (f"`{field}`", "'w'", "'b'", "share", "memory"),
            )
            if same_keys and not alias_ok:
                hostile.append(alias)
            elif same_keys and field in _SIGNED:
                valid.append(alias)
            continue
        if isinstance(value, Tensor) and value.dim() == 0:
            hostile += [
                Value(
                    f"{field}={label}",
                    replaced(init, field, _called(make)),
                    (f"`{field}`",),
                )
                for label, make in _COUNTS
                if field == "step" or label not in ("1.5", "int64", "float32")
            ]
    return Arg("state", tuple(valid), tuple(hostile))


# ---------------------------------------------------------------- torch's answer


def check_readable(saved: dict[str, Any], params: list[Tensor]) -> None:
    """Raise where torch's kernels would read a buffer unchecked (and may crash).

    torch's fused kernels read a buffer of another shape than its parameter's
    (a zero-size one, say) out of bounds, and a sparse one as if dense; such a
    state has no torch answer, so it must be refused. (Adafactor's factored
    `row_var` and `col_var` have shapes of their own.)
    """
    for i, buffers in saved["state"].items():
        for name, buffer in buffers.items():
            if not isinstance(buffer, Tensor) or name in ("row_var", "col_var"):
                continue
            sized = buffer.dim() > 0 and buffer.shape != params[i].shape
            if sized or buffer.layout != torch.strided:
                msg = f"torch's kernels would misread the `{name}` of {i}"
                raise ValueError(msg)


def torch_step(
    spec: Spec, params: Any, grads: Any, state: Any, *, steps: int = 1
) -> dict[str, Tensor]:
    """Return torch's parameters after `steps` steps from `state` (its export)."""
    assert spec.theirs is not None
    names = list(params)
    if not names and isinstance(grads, Mapping) and not grads:
        # torch.optim refuses to be built on no parameters; paramdict steps an
        # empty ParamDict (a group that matched nothing) to an empty one.
        return {}
    leaves = {k: params[k].detach().clone().requires_grad_() for k in names}
    options = {k: v for k, v in spec.options.items() if k != "fused"}
    theirs = spec.theirs(list(leaves.values()), **options)
    saved = optim.to_torch_state_dict(spec.make(), state, [names])
    check_readable(saved, [params[k] for k in names])
    _check_fused_shapes(saved, list(leaves.values()))
    theirs.load_state_dict(saved)
    for _ in range(steps):
        for k in names:
            leaves[k].grad = grads[k].detach().clone()
        try:
            theirs.step()
        except RuntimeError as err:
            # torch's ASGD reads a number of each parameter's state (`.item()`),
            # which meta tensors do not have; a step on meta tensors changes no
            # metadata, and `same` compares only the metadata of meta tensors.
            if "on meta tensors" not in str(err) or not any(
                leaves[k].is_meta for k in names
            ):
                raise
    # `step` returns leaves requiring grad where the old parameters did.
    return {
        k: v.detach().requires_grad_(params[k].requires_grad) for k, v in leaves.items()
    }


def _check_fused_shapes(exported: dict[str, Any], leaves: list[Tensor]) -> None:
    """Refuse, as torch 2.13 does, a fused step's buffer shaped unlike its parameter.

    torch 2.13's fused kernels raise an error for it; torch 2.6's crash the process
    (a zero-size `sum` for Adagrad's fused kernel); the releases between unchecked.
    """
    if torch_at_least(2, 13) or not any(
        g.get("fused") for g in exported["param_groups"]
    ):
        return
    for index, buffers in exported["state"].items():
        for name, value in buffers.items():
            if not isinstance(value, Tensor) or value.dim() == 0:
                continue  # a step count
            if value.shape != leaves[index].shape:
                msg = f"The buffer {name!r} is shaped unlike its parameter {index}."
                raise RuntimeError(msg)
