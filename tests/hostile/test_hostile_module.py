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
            RuntimeError,
            "elements|size|shape",
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
