"""`ParamDict`: the container and all its operations, assembled from the mixins."""

from __future__ import annotations

from typing import Any

from ._autograd import _Autograd
from ._inplace import _InPlace
from ._likes import _Likes
from ._module import _ModuleIO
from ._operators import _Operators
from ._pytree import register
from ._reduce import _Reduce
from ._select import _Select
from ._stack import _Stack

__all__ = ["ParamDict"]


class ParamDict(
    _Operators, _InPlace, _Reduce, _Select, _Likes, _Stack, _Autograd, _ModuleIO
):
    """An immutable mapping from names to tensors that keeps parameters keyed.

    A `dict[str, Tensor]` that cannot be changed in place and that supports what
    functional training needs: arithmetic (`params - lr * grads`) and fused
    torch-named math (`p.sub(g, alpha=lr)`, `m.lerp(g, 0.1)`, `v.addcmul(g, g)`),
    gradients keyed like the parameters (`params.grad(loss)`), reductions (`norm`,
    `dot`, `clip_norm`), selection by key (`select("*.bias")`, `scoped("encoder")`),
    per-tensor methods (`detach`, `to`, `zeros_like`, `map`), ensembles (`stack`),
    module in/out (`from_module`, `call`, `to_module`, `swapped_into`), and pytree
    behaviour, so `torch.func` and `torch.compile` see through it.

    Insertion order is kept and is the order of every result. Since a ParamDict is
    a real `dict`, anything that wants one (`torch.func.functional_call`,
    `module.load_state_dict`) accepts it. Operations return a new ParamDict of the
    same type (subclasses keep their type) and never change their operands.

    Args:
        mapping_or_pairs: A mapping or an iterable of `(key, tensor)` pairs.
        **kwargs: More entries, added after `mapping_or_pairs`.

    Raises:
        TypeError: If a key is not a `str` or a value is not a `torch.Tensor`; the
            message names the entries.

    Example:
        >>> import torch
        >>> from paramdict import ParamDict
        >>> p = ParamDict(w=torch.tensor([1.0, 2.0]), b=torch.tensor(0.5))
        >>> q = p - 0.1 * p
        >>> q["w"]
        tensor([0.9000, 1.8000])
        >>> p == ParamDict(b=torch.tensor(0.5), w=torch.tensor([1.0, 2.0]))
        True
    """

    __slots__ = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register(cls)


register(ParamDict)
