"""When a shared 0-dim operand goes to the foreach `.Tensor` overloads once.

`paramdict._foreach.call` passes one 0-dim tensor repeated for every entry to
`add`, `mul` and `div` as the one tensor it is, on an accelerator, where nothing
records or batches it (`_shared_scalar`). The values are checked on a CUDA device
(`tests/optim/test_optim_cuda.py`); here the decision is, on meta tensors (a
device that is not the CPU) and CPU ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from paramdict._foreach import _shared_scalar, call

META = "meta"


def _values(device: str = META, **kwargs: Any) -> list[torch.Tensor]:
    return [torch.empty(4, 3, device=device, **kwargs), torch.empty(5, device=device)]


@pytest.mark.parametrize(
    "op", [torch._foreach_add, torch._foreach_mul, torch._foreach_div]
)
def test_a_device_scalar_goes_once(op: Any) -> None:
    values = _values()
    t = torch.empty((), device=META)
    assert _shared_scalar(op, (values, [t, t])) is t


def test_other_operations_and_forms_keep_the_list() -> None:
    values = _values()
    t = torch.empty((), device=META)
    assert _shared_scalar(torch._foreach_sub, (values, [t, t])) is None  # no overload
    assert _shared_scalar(torch._foreach_mul, (values, [t, t.clone()])) is None
    assert _shared_scalar(torch._foreach_mul, (values, [t])) is None  # lengths differ
    assert _shared_scalar(torch._foreach_mul, (values, 2.0)) is None
    assert _shared_scalar(torch._foreach_mul, (values, values)) is None  # not 0-dim


def test_cpu_entries_keep_the_list() -> None:
    values = _values("cpu")
    t = torch.tensor(0.5)
    assert _shared_scalar(torch._foreach_mul, (values, [t, t])) is None


def test_what_autograd_records_keeps_the_list() -> None:
    t = torch.empty((), device=META, requires_grad=True)
    assert _shared_scalar(torch._foreach_mul, (_values(), [t, t])) is None
    values = _values(requires_grad=True)
    plain = torch.empty((), device=META)
    assert _shared_scalar(torch._foreach_mul, (values, [plain, plain])) is None
    with torch.no_grad():
        assert _shared_scalar(torch._foreach_mul, (values, [t, t])) is t


def test_a_cpu_scalar_goes_as_its_number_where_that_is_its_value() -> None:
    values = _values()  # float32 entries on a device
    same = torch.tensor(0.1)  # float32
    other = torch.tensor(0.1, dtype=torch.float64)
    assert _shared_scalar(torch._foreach_mul, (values, [same, same])) == same.item()
    assert _shared_scalar(torch._foreach_add, (values, [same, same])) == same.item()
    # `div` multiplies by a CPU scalar's reciprocal; another dtype rounds first
    assert _shared_scalar(torch._foreach_div, (values, [same, same])) is None
    assert _shared_scalar(torch._foreach_mul, (values, [other, other])) is None


def test_transforms_and_compiling_keep_the_list() -> None:
    t = torch.empty((), device=META)

    def decided(x: torch.Tensor) -> torch.Tensor:
        assert _shared_scalar(torch._foreach_mul, ([x, x], [t, t])) is None
        return x

    torch.func.vmap(decided)(torch.empty(3, 2, device=META))

    seen: list[object] = []

    def compiled(x: torch.Tensor) -> torch.Tensor:
        seen.append(_shared_scalar(torch._foreach_mul, ([x], [t])))
        return x * 2

    torch.compile(compiled, backend="eager")(torch.empty(2, device=META))  # pyright: ignore[reportUnknownMemberType]
    assert seen == [None]


_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    op=st.sampled_from(["add", "mul", "div"]),
    entry_dtypes=st.lists(st.sampled_from(_DTYPES), min_size=1, max_size=4),
    scalar_dtype=st.sampled_from(_DTYPES),
    scalar_on_cpu=st.booleans(),
    shapes=st.lists(
        st.lists(st.integers(0, 3), min_size=0, max_size=3), min_size=4, max_size=4
    ),
    grad_enabled=st.booleans(),
)
def test_the_once_form_has_the_per_entry_results_kinds(
    op: str,
    entry_dtypes: list[torch.dtype],
    scalar_dtype: torch.dtype,
    scalar_on_cpu: bool,
    shapes: list[list[int]],
    grad_enabled: bool,
) -> None:
    """On a device (meta), `call` gives each entry the per-entry op's dtype and shape.

    Whichever form `call` picks (once through a `.Tensor` overload, as a number,
    or the list), the results have the dtypes and shapes of `torch.<op>(entry,
    scalar)` entry by entry: no promotion differs. The values are compared on
    CUDA (`tests/optim/test_optim_cuda.py`).
    """
    values = [
        torch.empty(shape, dtype=dtype, device=META)
        for shape, dtype in zip(shapes, entry_dtypes)
    ]
    scalar = torch.ones((), dtype=scalar_dtype, device="cpu" if scalar_on_cpu else META)
    foreach = {
        "add": torch._foreach_add,
        "mul": torch._foreach_mul,
        "div": torch._foreach_div,
    }
    per_entry: dict[str, Callable[..., torch.Tensor]] = {
        "add": torch.add,
        "mul": torch.mul,
        "div": torch.div,
    }
    with torch.set_grad_enabled(grad_enabled):
        try:
            expected = [per_entry[op](v, scalar) for v in values]
        except RuntimeError:
            return  # a combination torch refuses entry by entry (not ours to decide)
        got = call(foreach[op], values, [scalar] * len(values))
    assert [r.dtype for r in got] == [r.dtype for r in expected]
    assert [r.shape for r in got] == [r.shape for r in expected]
    assert all(r.device.type == META for r in got)
