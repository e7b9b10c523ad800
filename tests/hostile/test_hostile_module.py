"""Bad input to the module helpers is refused before the module is touched.

Each case builds a fresh module (with a tied weight, a buffer, a hook and a
submodule in eval mode) and a ParamDict, makes one call with a bad input and expects
a clear error; the module's parameters, buffers (objects and values), hooks and
training flags and the ParamDict are bit-identical afterwards.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _torch_versions import script
from _unchanged import Case, check, operands, unique_ids
from torch import Tensor, nn

from paramdict import ParamDict


class Net(nn.Module):
    """A tied embedding and head around a batch norm in eval mode, with a hook."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.norm = nn.BatchNorm1d(3).eval()
        self.head = nn.Linear(3, 5, bias=False)
        self.head.weight = self.emb.weight
        self.register_forward_hook(lambda m, i, o: None)

    def forward(self, tokens: Tensor) -> Tensor:
        """Embed, normalize, project back with the tied weight."""
        out: Tensor = self.head(self.norm(self.emb(tokens)))
        return out


def _net() -> Net:
    torch.manual_seed(0)
    return Net()


def _both() -> tuple[Net, ParamDict]:
    net = _net()
    return net, ParamDict.from_module(net, buffers=True).detach().clone()


_TOKENS = torch.tensor([0, 3])

_NOT_MODULES: dict[str, Any] = {
    "dict": lambda: {"w": torch.ones(1)},
    "None": lambda: None,
    "ParamDict": lambda: ParamDict(w=torch.ones(1)),
    "function": lambda: lambda x: x,
    "module class": lambda: nn.Linear,
    "str": lambda: "model",
    "tensor": lambda: torch.ones(2),
    "list of modules": lambda: [nn.Linear(1, 1)],
    "state dict": lambda: nn.Linear(1, 1).state_dict(),
}


def _paramdict_and(build: Any) -> Any:
    return lambda: (_both()[1], build())


def _swap(p: ParamDict, module: Any) -> None:
    with p.swapped_into(module):
        pass


def _cases() -> list[Case]:
    cases = []
    for name, build in _NOT_MODULES.items():
        cases += [
            Case(
                f"from_module {name}",
                operands(build),
                ParamDict.from_module,
                TypeError,
                "`from_module` takes a torch.nn.Module",
            ),
            Case(
                f"call {name}",
                _paramdict_and(build),
                lambda p, m: p.call(m, _TOKENS),
                TypeError,
                "`call` takes a torch.nn.Module",
            ),
            Case(
                f"swapped_into {name}",
                _paramdict_and(build),
                _swap,
                TypeError,
                "`swapped_into` takes a torch.nn.Module",
            ),
            Case(
                f"to_module {name}",
                _paramdict_and(build),
                lambda p, m: p.to_module(m),
                TypeError,
                "`to_module` takes a torch.nn.Module",
            ),
        ]
    unknown = {"nope": torch.ones(1)}
    tied_apart = {"head.weight": torch.zeros(5, 3)}
    for what, run in (
        ("call", lambda p, m: p.call(m, _TOKENS)),
        ("swapped_into", _swap),
        ("to_module", lambda p, m: p.to_module(m, strict=False)),
    ):
        cases += [
            Case(
                f"{what} unknown key",
                lambda: (*_both(), unknown),
                lambda m, p, extra, r=run: r(p | extra, m),
                ValueError,
                r"\['nope'\]",
            ),
            Case(
                f"{what} tied names apart",
                lambda: (*_both(), tied_apart),
                lambda m, p, extra, r=run: r(p | extra, m),
                ValueError,
                r"\['emb.weight', 'head.weight'\] are tied",
            ),
        ]
    cases += [
        Case(
            "call scripted",
            lambda: (_both()[1], _scripted()),
            lambda p, m: p.call(m, torch.ones(1, 2)),
            TypeError,
            "TorchScript",
        ),
        Case(
            "swapped_into scripted",
            lambda: (_both()[1], _scripted()),
            _swap,
            TypeError,
            "TorchScript",
        ),
        Case(
            "call a forward that fails",
            lambda: (*_both(),),
            lambda m, p: p.call(m, torch.tensor([9])),
            IndexError,
            "index out of range",
        ),
        Case(
            "call an entry of the wrong shape",
            lambda: (*_both(),),
            lambda m, p: (p | {"emb.weight": torch.ones(5, 4)}).call(m, _TOKENS),
            ValueError,
            r"forward failed(?s:.*)'emb\.weight' \(float32\[5, 4\] cpu vs "
            r"float32\[5, 3\]",
        ),
        Case(
            "to_module missing",
            lambda: (*_both(),),
            lambda m, p: p.exclude("norm.*").to_module(m),
            ValueError,
            r"missing \['norm.bias', .*strict=False",
        ),
        Case(
            "to_module wrong shape",
            lambda: (*_both(),),
            lambda m, p: (p | {"norm.bias": torch.ones(4)}).to_module(m),
            ValueError,
            r"shape differs for 'norm.bias' \(\(4,\) vs \(3,\)\)",
        ),
        Case(
            "to_module wrong dtype",
            lambda: (*_both(),),
            lambda m, p: (p | {"norm.bias": torch.ones(3).double()}).to_module(m),
            ValueError,
            "dtype differs for 'norm.bias'",
        ),
        Case(
            "to_module meta entry after good ones",
            lambda: (*_both(),),
            lambda m, p: (p | {"norm.bias": torch.ones(3, device="meta")}).to_module(m),
            ValueError,
            "meta tensor holds no values for 'norm.bias'",
        ),
        Case(
            "to_module sparse entry after good ones",
            lambda: (*_both(),),
            lambda m, p: (p | {"norm.bias": torch.ones(3).to_sparse()}).to_module(m),
            ValueError,
            "not a dense tensor for 'norm.bias'",
        ),
        Case(
            "to_module several problems sorted",
            lambda: (*_both(),),
            lambda m, p: (
                p | {"norm.weight": torch.ones(2), "norm.bias": torch.ones(2)}
            ).to_module(m),
            ValueError,
            r"'norm.bias' \(\(2,\) vs \(3,\)\), 'norm.weight'",
        ),
        Case(
            "to_module int entry for a float tensor",
            lambda: (*_both(),),
            lambda m, p: (
                p | {"norm.num_batches_tracked": torch.tensor(0.0)}
            ).to_module(m),
            ValueError,
            "dtype differs for 'norm.num_batches_tracked'",
        ),
    ]
    return cases


def _scripted() -> Any:
    return script(nn.Linear(2, 2))


ALL = unique_ids(_cases())


@pytest.mark.parametrize("case", [c.param() for c in ALL])
def test_bad_input_is_refused_and_nothing_changes(case: Case) -> None:
    """The call raises a clear error and the module and ParamDict are unchanged."""
    check(case)


def test_to_module_on_a_scripted_module_writes_in_place() -> None:
    """`to_module` works on a TorchScript module (it only copies in place)."""
    scripted = _scripted()
    p = ParamDict.from_module(scripted).detach().zeros_like()
    p.to_module(scripted)
    assert float(scripted.weight.detach().abs().sum()) == 0.0


def test_self_referencing_modules_work_everywhere() -> None:
    """`m.l1.m = m` gives the same names as `named_parameters()` and no recursion."""
    net = nn.Sequential(nn.Linear(2, 2))
    net[0].m = net  # a cycle on purpose
    p = ParamDict.from_module(net).detach().zeros_like()
    assert list(p) == ["0.weight", "0.bias"]
    x = torch.ones(1, 2)
    torch.testing.assert_close(p.call(net, x), torch.zeros(1, 2))
    with p.swapped_into(net):
        torch.testing.assert_close(net(x), torch.zeros(1, 2))
    p.to_module(net)
    torch.testing.assert_close(net(x), torch.zeros(1, 2))


class _Loop(nn.Module):
    """`l1.parent` is the module itself: `l1.parent.l1.weight` is `l1.weight`."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(1, 1)
        self.l1.parent = self  # a cycle on purpose
        self.register_buffer("buffer", torch.ones(1))

    def forward(self, x: Tensor) -> Tensor:
        """Return `l1(x) + buffer`."""
        out: Tensor = self.l1(x) + self.buffer
        return out


def _through_the_cycle() -> ParamDict:
    return ParamDict(
        {
            "l1.parent.l1.weight": torch.tensor([[2.0]]),
            "l1.bias": torch.tensor([0.5]),
            "l1.parent.buffer": torch.tensor([1.0]),
        }
    )


def test_call_takes_names_through_a_cycle_as_functional_call_does() -> None:
    """Names through a cycle reach their tensors, as with `tie_weights=False`."""
    module, x = _Loop(), torch.tensor([[3.0]])
    p = _through_the_cycle()
    expected = torch.func.functional_call(module, dict(p), (x,), tie_weights=False)
    torch.testing.assert_close(p.call(module, x), expected)
    torch.testing.assert_close(expected, torch.tensor([[7.5]]))
    with p.swapped_into(module):
        torch.testing.assert_close(module(x), expected)
    assert module.l1.weight.item() != 2.0  # the module has its own back


def test_to_module_writes_through_a_cycle() -> None:
    """`to_module` copies a name through a cycle into the tensor it reaches."""
    module = _Loop()
    _through_the_cycle().to_module(module)
    torch.testing.assert_close(module.l1.weight.detach(), torch.tensor([[2.0]]))
    torch.testing.assert_close(module.buffer, torch.tensor([1.0]))


def test_two_names_of_one_tensor_through_a_cycle_must_agree() -> None:
    """A name and its alias through the cycle given different tensors are refused."""
    module = _Loop()
    before = ParamDict.from_module(module, buffers=True).clone()
    p = _through_the_cycle() | {"l1.weight": torch.tensor([[5.0]])}
    for run in (lambda: p.call(module, torch.ones(1, 1)), lambda: p.to_module(module)):
        with pytest.raises(ValueError, match=r"'l1\.parent\.l1\.weight', 'l1\.weight'"):
            run()
    assert ParamDict.from_module(module, buffers=True) == before


def test_call_under_vmap_on_a_cycle() -> None:
    """`call` under `torch.func.vmap` names tensors without walking into the cycle."""
    module = _Loop()
    p = ParamDict.from_module(module, buffers=True).detach()
    xs = torch.ones(4, 1, 1)
    out = torch.func.vmap(lambda x: p.call(module, x))(xs)
    torch.testing.assert_close(out, torch.stack([module(x) for x in xs]).detach())


def test_a_forward_failing_on_unlike_entries_names_them() -> None:
    """`call` names the entries unlike the module's own when its forward fails."""
    module = _Loop()
    p = ParamDict({"l1.weight": torch.ones(1, 1, dtype=torch.float64)})
    with pytest.raises(
        ValueError,
        match=r"forward failed \(.*\) with entries unlike the module's own tensors: "
        r"'l1\.weight' \(float64\[1, 1\] cpu vs float32\[1, 1\] cpu\)",
    ):
        p.call(module, torch.ones(1, 1))


def test_a_forward_failing_on_its_own_is_passed_on_with_a_note() -> None:
    """With nothing unlike swapped in, the module's own error is raised, noted."""
    module = _Loop()
    p = ParamDict.from_module(module).detach()
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied") as info:
        p.call(module, torch.ones(1, 2))
    assert getattr(info.value, "__notes__", []) == [
        "(raised by the forward of _Loop, run by `call`)"
    ]
