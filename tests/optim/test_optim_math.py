"""Rules written as `math`: one rule, the same numbers in every mode.

A rule writes into the parameters and the state it is handed with ParamDict's
in-place arithmetic; `step_` hands it the caller's tensors, `step` fresh copies,
`differentiable=True` copies that autograd records. So a rule, correct or not,
gives the same numbers in every mode: a rule that reads a buffer after writing
into it reads the written value everywhere. Randomly written rules (hypothesis)
check this; a rule autograd cannot differentiate (an in-place write over a value
it saved) raises in the recorded mode, never a silent difference.
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

import attrs
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import Tensor

from paramdict import ParamDict, optim


@optim.register_state
class PairState(NamedTuple):
    """A counter and two buffers, `m` and `v`, for the rules below."""

    step: Tensor
    m: ParamDict
    v: ParamDict
    schedule: optim.SlotState = ()


Op = tuple[str, str, str, float]
"""One instruction: (operation, target, operand, number)."""
WRITABLE = ("p", "m", "v", "t")
READABLE = ("p", "m", "v", "t", "g")


def _run(
    program: tuple[Op, ...], params: ParamDict, grads: ParamDict, state: Any
) -> None:
    """Interpret `program`: in-place writes into p, m, v and a temporary t."""
    names: dict[str, ParamDict] = {
        "p": params,
        "g": grads,
        "m": state.m,
        "v": state.v,
        "t": grads.abs().add(0.5),
    }
    for op, target, source, number in program:
        x, y = names[target], names[source]
        if op == "lerp_":
            x.lerp_(y, abs(number) % 1)
        elif op == "mul_":
            x.mul_(number)
        elif op == "add_":
            x.add_(y, alpha=number)
        elif op == "addcmul_":
            x.addcmul_(y, y, value=number)
        elif op == "addcdiv_":
            x.addcdiv_(y, names["t"].abs().add(1.0), value=number)
        elif op == "clamp_":
            x.clamp_(-abs(number) - 1, abs(number) + 1)
        elif op == "copy_":
            x.copy_(y)
        elif op == "new":  # a temporary made out of place from a read
            names["t"] = y.mul(number).add(1.0)
        elif op == "sqrt":  # a temporary made by a square root
            names["t"] = y.abs().add(1.0).sqrt()


@attrs.frozen(kw_only=True, eq=False, field_transformer=optim.fields.shared_last)
class Scripted(optim.TorchOptimizer[PairState]):
    """An optimizer whose rule is a program of in-place operations."""

    state_type: ClassVar[type[PairState]] = PairState

    lr: optim.LearningRate = 0.1
    weight_decay: optim.Rate = 0.0
    program: tuple[Op, ...] = ()

    def math(
        self,
        params: ParamDict,
        grads: ParamDict,
        state: PairState,
        step: Tensor,
        lr: optim.Rate,
        /,
    ) -> None:
        """Run the program, then a plain step of the parameters."""
        _run(self.program, params, grads, state)
        params.sub_(grads, alpha=lr)


OPS = st.tuples(
    st.sampled_from(
        [
            "lerp_",
            "mul_",
            "add_",
            "addcmul_",
            "addcdiv_",
            "clamp_",
            "copy_",
            "new",
            "sqrt",
        ]
    ),
    st.sampled_from(WRITABLE),
    st.sampled_from(READABLE),
    st.floats(-1.5, 1.5, allow_nan=False, width=32),
)


def _start() -> tuple[ParamDict, list[ParamDict]]:
    gen = torch.Generator().manual_seed(0)
    params = ParamDict(
        w=torch.randn(3, 2, generator=gen, dtype=torch.float64),
        b=torch.randn(2, generator=gen, dtype=torch.float64),
    )
    grads = [
        params.map(lambda v: torch.randn(v.shape, generator=gen, dtype=v.dtype))
        for _ in range(3)
    ]
    return params, grads


def _trained(opt: Scripted, mode: str) -> list[Tensor]:
    params, grads = _start()
    state = opt.init(params)
    for g in grads:
        if mode == "step_":
            params, state = opt.step_(params, g, state)
        else:
            params, state = opt.step(params, g, state)
    return [*params.values(), *state.m.values(), *state.v.values()]


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(program=st.lists(OPS, min_size=1, max_size=8).map(tuple))
def test_a_random_rule_gives_the_same_numbers_in_every_mode(
    program: tuple[Op, ...],
) -> None:
    """`step`, `step_` and the recorded `step` agree bitwise, or the recorded raises."""
    plain = _trained(Scripted(program=program), "step")
    in_place = _trained(Scripted(program=program), "step_")
    for a, b in zip(plain, in_place, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    try:
        recorded = _trained(Scripted(program=program, differentiable=True), "step")
    except RuntimeError as err:  # autograd's refusal, named
        refused = str(err)
        recorded = []
    else:
        refused = ""
    if refused:
        assert "modified by an inplace operation" in refused
        return
    for a, b in zip(plain, recorded, strict=True):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=0, equal_nan=True)


def test_reading_a_written_buffer_reads_the_written_value_in_every_mode() -> None:
    """A rule that scales a buffer, then reads it, reads the scaled one everywhere.

    The rule `doubled = m * 10` (out of place), then `p += m`, with `m` at ones
    and `p` at [1, 2], gives [2, 3] in every mode; writing `m *= 10` first gives
    [11, 12] in every mode.
    """
    for program, expected in (
        ((("new", "t", "m", 10.0), ("add_", "p", "m", 1.0)), [2.0, 3.0]),
        ((("mul_", "m", "m", 10.0), ("add_", "p", "m", 1.0)), [11.0, 12.0]),
    ):
        for differentiable in (False, True):
            for mode in ("step", "step_"):
                if differentiable and mode == "step_":
                    continue
                opt = Scripted(program=program, lr=0.0, differentiable=differentiable)
                params = ParamDict(w=torch.tensor([1.0, 2.0]))
                state = opt.init(params)
                state = state._replace(m=state.m.ones_like())
                step = opt.step_ if mode == "step_" else opt.step
                new, _ = step(params, params.zeros_like(), state)
                torch.testing.assert_close(new["w"].detach(), torch.tensor(expected))


def test_a_rule_returning_a_new_state_in_place_is_refused() -> None:
    """An `update_` that returns another state object is refused in `step_`."""

    class Replacing(optim.Optimizer[PairState]):
        __slots__ = ()
        differentiable = False

        def init(self, params: ParamDict, /) -> PairState:
            return PairState(torch.zeros((), dtype=torch.float64), params, params)

        def update_(
            self, params: ParamDict, grads: ParamDict, state: PairState, /
        ) -> PairState:
            return state._replace(m=state.m.clone())

    params = ParamDict(w=torch.ones(2))
    opt = Replacing()
    state = PairState(
        torch.zeros((), dtype=torch.float64), params.clone(), params.clone()
    )
    with pytest.raises(TypeError, match=r"update_` returned a new state"):
        opt.step_(params, params.ones_like(), state)
