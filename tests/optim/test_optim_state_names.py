"""Saved states keep their names, and load before any optimizer is imported.

The state classes are defined apart from their optimizers, so that importing
`paramdict.optim` registers them without building the optimizers, yet they pickle
and flatten under their optimizer's module, as they always have: checkpoints saved
before the move name `paramdict.optim.adam AdamState`, and so do those saved now.
"""

from __future__ import annotations

import io
import json
import pickletools
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils import _pytree as pytree

from paramdict import ParamDict, optim

SAVED_AS = {
    "ASGDState": "paramdict.optim.asgd",
    "AdEMAMixState": "paramdict.optim.ademamix",
    "AdadeltaState": "paramdict.optim.adadelta",
    "AdafactorState": "paramdict.optim.adafactor",
    "AdagradState": "paramdict.optim.adagrad",
    "AdamState": "paramdict.optim.adam",
    "AdamaxState": "paramdict.optim.adamax",
    "AdanState": "paramdict.optim.adan",
    "AveragedState": "paramdict.optim.swa_utils",
    "LBFGSState": "paramdict.optim.lbfgs",
    "LionState": "paramdict.optim.lion",
    "MultiStepsState": "paramdict.optim._accumulate",
    "MuonState": "paramdict.optim.muon",
    "NAdamState": "paramdict.optim.nadam",
    "PlateauState": "paramdict.optim._schedules.plateau",
    "RAdamState": "paramdict.optim.radam",
    "RMSpropState": "paramdict.optim.rmsprop",
    "RpropState": "paramdict.optim.rprop",
    "SGDState": "paramdict.optim.sgd",
    "SOAPState": "paramdict.optim.soap",
    "ScheduleFreeAdamWState": "paramdict.optim.schedule_free",
    "ScheduleState": "paramdict.optim._schedules.base",
}
"""Where each state class was defined when it was first saved: its pickled name."""


def _placeholder(name: str) -> Any:
    """A state of class `name` holding a distinct 0-dim tensor in each field."""
    cls = getattr(optim, name)
    return cls(*(torch.tensor(float(i)) for i in range(len(cls._fields))))


def _nested() -> dict[str, Any]:
    """States as optimizers build them, with schedules and wrappers inside."""
    params = ParamDict(w=torch.tensor([1.0, -2.0]))
    lbfgs = optim.LBFGS(max_iter=2)
    _, lbfgs_state = lbfgs.step(
        params, lambda p: (p["w"] ** 2).sum(), lbfgs.init(params)
    )
    swa = optim.WeightAverage.swa()
    adam = optim.Adam(lr=optim.StepLR(base_lr=0.1, step_size=2))
    return {
        "multi_steps": optim.MultiSteps(adam, every_k=2).init(params),
        "plateau": optim.SGD(lr=optim.ReduceLROnPlateau(base_lr=0.1)).init(params),
        "lbfgs": lbfgs_state,
        "averaged": swa.update(swa.init(params), params),
    }


def _pickled_globals(state: object) -> set[str]:
    """The `module name` pairs the pickle of `torch.save(state)` refers to."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    with zipfile.ZipFile(buffer) as archive:
        (data,) = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        ops = list(pickletools.genops(archive.read(data)))
    assert all(op.name != "STACK_GLOBAL" for op, _, _ in ops)  # torch's protocol 2
    return {str(arg) for op, arg, _ in ops if op.name == "GLOBAL"}


def test_the_table_lists_every_state_class() -> None:
    """Every NamedTuple `paramdict.optim` exports is registered and listed here."""
    exported = {
        name
        for name in optim.__all__
        if isinstance(getattr(optim, name), type)
        and issubclass(getattr(optim, name), tuple)
    }
    assert exported == set(SAVED_AS)
    registered = set(torch.serialization.get_safe_globals())
    assert all(getattr(optim, name) in registered for name in SAVED_AS)


@pytest.mark.parametrize("name", sorted(SAVED_AS))
def test_a_state_pickles_and_flattens_under_its_old_name(name: str) -> None:
    """The pickle and the pytree spec name the module the class was saved under."""
    state = _placeholder(name)
    assert f"{SAVED_AS[name]} {name}" in _pickled_globals(state)
    spec = pytree.treespec_dumps(pytree.tree_structure(state))
    assert f'"{SAVED_AS[name]}.{name}"' in spec
    assert getattr(sys.modules[SAVED_AS[name]], name) is type(state)


_LOADER = """
import json, sys
import torch, paramdict.optim
from torch.utils import _pytree as pytree

def plain(leaf):
    return leaf.tolist() if isinstance(leaf, torch.Tensor) else leaf

found = {}
for path in sys.argv[1:]:
    state = torch.load(path, weights_only=True)
    kind = type(state)
    leaves = [plain(leaf) for leaf in pytree.tree_leaves(state)]
    found[path] = [f"{kind.__module__}.{kind.__qualname__}", leaves]
print(json.dumps([found, "attr" in sys.modules]))
"""


def test_saved_states_load_before_any_optimizer_is_imported(tmp_path: Path) -> None:
    """A fresh process that imported only `paramdict.optim` loads every state."""
    states = {name: _placeholder(name) for name in SAVED_AS} | _nested()
    paths = {}
    for key, state in states.items():
        paths[key] = str(tmp_path / f"{key}.pt")
        torch.save(state, paths[key])
    done = subprocess.run(
        [sys.executable, "-c", _LOADER, *paths.values()],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found, attrs_loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert not attrs_loaded  # no optimizer was built to load them
    for key, state in states.items():
        kind, leaves = found[paths[key]]
        assert kind == f"{type(state).__module__}.{type(state).__qualname__}"
        expected = [
            leaf.tolist() if isinstance(leaf, torch.Tensor) else leaf
            for leaf in pytree.tree_leaves(state)
        ]
        assert leaves == expected, key
    for name in SAVED_AS:
        assert found[paths[name]][0] == f"{SAVED_AS[name]}.{name}"
