"""In-place arithmetic without operands: `sqrt_`, `neg_`, `abs_`, `zero_`, ...

Each is one foreach kernel through `_write`, which `_inplace._InPlace` defines
(the first write of a container that is still a pending copy makes the copy).
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import Self

from ._container import _Container

__all__: list[str] = []


class _InPlaceUnary(_Container):
    __slots__ = ()

    def _write(self, op: Any, /, *args: Any, **kwargs: Any) -> Self:
        raise NotImplementedError  # `_inplace._InPlace._write`

    def sqrt_(self) -> Self:
        """Replace every entry by its square root; return `self`.

        Returns:
            `self`, its tensors updated.

        Example:
            >>> ParamDict(w=torch.tensor([4.0, 9.0])).sqrt_()["w"]
            tensor([2., 3.])
        """
        return self._write(torch._foreach_sqrt_)

    def neg_(self) -> Self:
        """Negate every entry; return `self`.

        Returns:
            `self`, its tensors updated.

        Example:
            >>> ParamDict(w=torch.tensor([1.0, -2.0])).neg_()["w"]
            tensor([-1.,  2.])
        """
        return self._write(torch._foreach_neg_)

    def abs_(self) -> Self:
        """Replace every entry by its absolute value; return `self`.

        Returns:
            `self`, its tensors updated.

        Example:
            >>> ParamDict(w=torch.tensor([1.0, -2.0])).abs_()["w"]
            tensor([1., 2.])
        """
        return self._write(torch._foreach_abs_)

    def sign_(self) -> Self:
        """Replace every entry by its sign; return `self`.

        Returns:
            `self`, its tensors updated.

        Example:
            >>> ParamDict(w=torch.tensor([3.0, -2.0, 0.0])).sign_()["w"]
            tensor([ 1., -1.,  0.])
        """
        return self._write(torch._foreach_sign_)

    def reciprocal_(self) -> Self:
        """Replace every entry by its reciprocal; return `self`.

        Returns:
            `self`, its tensors updated.

        Example:
            >>> ParamDict(w=torch.tensor([4.0])).reciprocal_()["w"]
            tensor([0.2500])
        """
        return self._write(torch._foreach_reciprocal_)

    def exp_(self) -> Self:
        """Replace every entry by its exponential; return `self`.

        Returns:
            `self`, its tensors updated.

        Example:
            >>> ParamDict(w=torch.tensor([0.0])).exp_()["w"]
            tensor([1.])
        """
        return self._write(torch._foreach_exp_)

    def log_(self) -> Self:
        """Replace every entry by its natural logarithm; return `self`.

        Returns:
            `self`, its tensors updated.

        Example:
            >>> ParamDict(w=torch.tensor([1.0])).log_()["w"]
            tensor([0.])
        """
        return self._write(torch._foreach_log_)

    def zero_(self) -> Self:
        """Fill every entry with zeros; return `self`.

        Returns:
            `self`, its tensors updated.

        Example:
            >>> ParamDict(w=torch.tensor([1.0, 2.0])).zero_()["w"]
            tensor([0., 0.])
        """
        return self._write(torch._foreach_zero_)
