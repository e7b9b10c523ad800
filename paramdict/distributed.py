"""Keyed, coalesced collectives on ParamDicts over `torch.distributed`.

`all_reduce`, `broadcast` and `all_gather` take a ParamDict and return new ones with
the same keys, order and type. Entries that share a dtype and a device travel together
in a few flat buffers (at most `bucket_cap_mb` MiB each, 25 by default as in
`DistributedDataParallel`), so a model with hundreds of tensors costs a handful of
collectives, not one per tensor.

Before any data moves, the processes check with one small collective that they all
hold the same keys, in the same order, with the same shapes, dtypes and devices, and
call the same operation with the same options. When they do not, every process raises
a `ValueError` naming what differs, instead of hanging or mixing up entries.

The collectives are not recorded by autograd: results never require grad, even when
the inputs do. All-reduce gradients after computing them (`params.grad(loss)`), which
is what data-parallel training does. Inputs are never changed; each result entry is a
view into a flat buffer shared with the other entries of its bucket.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar, cast, get_args

import torch
import torch.distributed as dist
from torch import Tensor

from . import _buckets
from ._checks import is_float_or_complex
from ._paramdict import ParamDict

__all__ = ["ReduceOpName", "all_gather", "all_reduce", "broadcast"]

P = TypeVar("P", bound=ParamDict)

ReduceOpName = Literal["sum", "mean", "max", "min", "product"]
"""How `all_reduce` combines the processes' values."""

# Names of `torch.distributed.ReduceOp` members, looked up when called: builds of
# torch without distributed support have no `ReduceOp`, and `import paramdict` must
# still work there.
_REDUCE_OPS = {
    "sum": "SUM",
    "mean": "SUM",  # then divided by the group size
    "max": "MAX",
    "min": "MIN",
    "product": "PRODUCT",
}

_Entry = tuple[str, tuple[int, ...], str, str, str]
"""What must agree across processes for one entry: key, shape, dtype, device, kind."""


# ---------------------------------------------------------------- argument checks


def _check_paramdict(p: object, name: str) -> None:
    if not isinstance(p, ParamDict):
        msg = (
            f"`{name}` takes a ParamDict, got {type(p).__name__}. Wrap a mapping of "
            "tensors with `ParamDict(...)` first."
        )
        raise TypeError(msg)


def _check_group(group: dist.ProcessGroup | None, name: str) -> None:
    if group is not None and not (
        dist.is_available() and isinstance(group, dist.ProcessGroup)
    ):
        msg = (
            f"`{name}` takes a `torch.distributed.ProcessGroup` (or `None` for the "
            f"default group) as `group`, got {type(group).__name__}."
        )
        raise TypeError(msg)
    if not dist.is_available():
        msg = f"`{name}` needs `torch.distributed`, which this build of torch lacks."
        raise ValueError(msg)
    if not dist.is_initialized():
        msg = (
            f"`{name}` needs a process group: call "
            "`torch.distributed.init_process_group(...)` first (under `torchrun` it "
            'needs only the backend, e.g. `init_process_group("gloo")`).'
        )
        raise ValueError(msg)
    if dist.get_rank(group) < 0:
        msg = (
            f"`{name}` was called on process {dist.get_rank()}, which is not a member "
            "of `group`. Call it only on the group's members."
        )
        raise ValueError(msg)


def _check_src(src: object, group: dist.ProcessGroup | None) -> None:
    if isinstance(src, bool) or not isinstance(src, int):
        msg = (
            f"`broadcast` takes an int global rank as `src`, got {type(src).__name__}."
        )
        raise TypeError(msg)
    ranks = (
        range(dist.get_world_size())
        if group is None
        else dist.get_process_group_ranks(group)
    )
    if src not in ranks:
        msg = (
            f"`broadcast` takes as `src` the global rank of a process in `group`, got "
            f"{src}; the group holds the ranks {sorted(ranks)!r}."
        )
        raise ValueError(msg)


def _cap_bytes(bucket_cap_mb: float, name: str) -> int:
    if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, int | float):
        msg = (
            f"`{name}` takes a number for `bucket_cap_mb`, got "
            f"{type(bucket_cap_mb).__name__}."
        )
        raise TypeError(msg)
    if not bucket_cap_mb > 0:
        msg = (
            f"`{name}` needs `bucket_cap_mb` > 0, got {bucket_cap_mb!r}. It is the "
            "largest flat buffer in MiB; 25 is the default."
        )
        raise ValueError(msg)
    cap = bucket_cap_mb * 2**20
    return max(1, int(cap)) if math.isfinite(cap) else sys.maxsize


# ---------------------------------------------------------------- agreement


def _entries(p: ParamDict) -> list[_Entry]:
    devices: dict[torch.device, int] = {}
    entries: list[_Entry] = []
    for key, value in p.items():
        # Device indices may differ between processes (cuda:0, cuda:1); what must
        # agree is how entries are spread over devices, which sets the buckets: the
        # device type, numbered by first appearance when there are several.
        device = value.device
        order = devices.setdefault(device, len(devices))
        layout = value.layout
        entries.append(
            (
                key,
                tuple(value.shape),
                str(value.dtype)[6:],  # without "torch."
                device.type if order == 0 else f"{device.type} #{order}",
                type(value).__name__
                if layout == torch.strided
                else f"{type(value).__name__} ({layout})",
            )
        )
    return entries


def _fingerprint(call: str, entries: list[_Entry]) -> int:
    digest = hashlib.blake2b(repr((call, entries)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2  # fits int64 with its negation


def _scratch_device(p: ParamDict, group: dist.ProcessGroup | None) -> torch.device:
    for value in p.values():
        if not value.is_meta:  # meta entries are refused after the agreement
            return value.device
    if str(dist.get_backend(group)) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _agree(p: ParamDict, call: str, group: dist.ProcessGroup | None, name: str) -> None:
    """Raise the same ValueError on every process unless they all match."""
    entries = _entries(p)
    mine = _fingerprint(call, entries)
    # One all-reduce of (h, -h) with MAX gives (max h, -min h): equal to (h, -h) on
    # every process exactly when all fingerprints are equal, and otherwise different
    # from it on every process, so they all take the same branch below.
    both = torch.tensor(
        [mine, -mine], dtype=torch.int64, device=_scratch_device(p, group)
    )
    # torch.distributed leaves the `group` parameters of its collectives untyped.
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)  # pyright: ignore[reportUnknownMemberType]
    highest, negated_lowest = cast("list[int]", both.tolist())  # pyright: ignore[reportUnknownMemberType]
    if highest == mine and -negated_lowest == mine:
        return
    gathered: list[Any] = [None] * dist.get_world_size(group)
    all_gather_object = cast("Callable[..., None]", dist.all_gather_object)  # pyright: ignore[reportUnknownMemberType]
    all_gather_object(gathered, (dist.get_rank(), call, entries), group=group)
    msg = _mismatch_message(name, gathered)
    raise ValueError(msg)


def _mismatch_message(name: str, gathered: Sequence[Any]) -> str:
    first_rank, first_call, first = gathered[0]
    first_keys = [e[0] for e in first]
    problems: list[str] = []
    for rank, call, entries in gathered[1:]:
        keys = [e[0] for e in entries]
        if call != first_call:
            problems.append(
                f"rank {rank} calls `{call}` while rank {first_rank} calls "
                f"`{first_call}`"
            )
        if set(keys) != set(first_keys):
            parts: list[str] = []
            missing = sorted(set(first_keys) - set(keys))
            unexpected = sorted(set(keys) - set(first_keys))
            if missing:
                parts.append(f"lacks {missing!r}")
            if unexpected:
                parts.append(f"has extra {unexpected!r}")
            problems.append(
                f"rank {rank} "
                + " and ".join(parts)
                + f" compared to rank {first_rank}"
            )
            continue
        if keys != first_keys:
            at = next(i for i, (a, b) in enumerate(zip(keys, first_keys)) if a != b)
            problems.append(
                f"rank {rank} orders the keys differently from rank {first_rank} "
                f"(position {at} holds {keys[at]!r} there and {first_keys[at]!r} on "
                f"rank {first_rank})"
            )
            continue
        for field, label in ((1, "shape"), (2, "dtype"), (3, "device"), (4, "type")):
            differ = [
                f"{e[0]!r} is {e[field]} there and {f[field]} on rank {first_rank}"
                for e, f in zip(entries, first)
                if e[field] != f[field]
            ]
            if differ:
                problems.append(
                    f"rank {rank} differs in {label}: " + ", ".join(sorted(differ))
                )
    detail = "; ".join(problems) if problems else "the processes disagree"
    return (
        f"`{name}` needs the same keys, in the same order, with the same shapes, "
        "dtypes and devices on every process, and the same options, but "
        f"{detail}. Build the ParamDict the same way on every process (for example "
        "with `ParamDict.from_module` of the same model) and make the same call, "
        "with the same arguments, everywhere."
    )


# ---------------------------------------------------------------- entry checks


def _check_entries(
    p: ParamDict,
    name: str,
    allowed: Callable[[Tensor], bool],
    requirement: str,
    fix: str,
) -> None:
    bad = sorted(k for k, v in p.items() if not allowed(v))
    if bad:
        msg = f"`{name}` needs {requirement}; {bad!r} are not. {fix}"
        raise TypeError(msg)


def _check_plain(p: ParamDict, name: str) -> None:
    # No value can be a DTensor unless its module was imported; importing it here
    # would cost more than the collective. Before torch 2.5 it lived in `_tensor`.
    dtensor = tuple(
        cls
        for module in ("torch.distributed.tensor", "torch.distributed._tensor")
        if (cls := getattr(sys.modules.get(module), "DTensor", None)) is not None
    )
    _check_entries(
        p,
        name,
        lambda v: v.layout == torch.strided and not isinstance(v, dtensor),
        "dense tensors that are not DTensors",
        "A DTensor carries its own placement and is reduced by its own "
        "`redistribute`/`full_tensor`; pass `.to_local()` shards or dense copies "
        "instead, or leave the entries out.",
    )
    meta = sorted(k for k, v in p.items() if v.is_meta)
    if meta:
        msg = (
            f"`{name}` sends values, and the entries {meta!r} are meta tensors, "
            "which hold none. Move them to a real device first (`.to(device)`), or "
            "leave them out."
        )
        raise ValueError(msg)


# ---------------------------------------------------------------- collectives


def all_reduce(
    p: P,
    /,
    *,
    op: ReduceOpName = "sum",
    group: dist.ProcessGroup | None = None,
    bucket_cap_mb: float = 25.0,
) -> P:
    """Return `p` combined over all processes of `group`, keyed like `p`.

    The keyed, coalesced form of `torch.distributed.all_reduce`: entries are packed
    into one flat buffer per dtype and device (split at `bucket_cap_mb`), reduced
    with one collective each, and unpacked. Every process gets the same result; `p`
    is unchanged. The result does not require grad (see the module notes).

    Args:
        p: The values of this process. Every process passes the same keys, in the
            same order, with the same shapes, dtypes and devices.
        op: `"sum"`, `"mean"` (the sum divided by the group size; floating-point or
            complex entries only), `"max"`, `"min"` or `"product"`.
        group: The process group; the default group when `None`.
        bucket_cap_mb: The largest flat buffer, in MiB.

    Returns:
        A new ParamDict of the same type, keys and order as `p`.

    Raises:
        TypeError: If `p` is not a ParamDict, `op` is not one of the names above, or
            some entries cannot be reduced that way (integer entries with `"mean"`,
            complex ones with `"max"`/`"min"`/`"product"`, sparse tensors,
            DTensors); the message names the entries.
        ValueError: If no process group is initialized, this process is not in
            `group`, `bucket_cap_mb` is not positive, or the processes disagree on
            keys, order, shapes, dtypes, devices or options; the message names the
            keys and ranks, and every process raises it. If some entries are meta
            tensors, which hold no values (named).

    Example:
        >>> import torch.distributed as dist
        >>> store = dist.HashStore()  # one process: no rendezvous needed
        >>> dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        >>> grads = ParamDict(w=torch.tensor([1.0, 2.0]), b=torch.tensor(3.0))
        >>> all_reduce(grads, op="mean")  # one process: the mean is `grads` itself
        ParamDict(  # 2 entries, 3 elements
          'w': float32[2] cpu,
          'b': float32[] cpu,
        )
        >>> dist.destroy_process_group()
    """
    name = "all_reduce"
    _check_paramdict(p, name)
    given: object = op  # checked at run time (unhashable values too)
    if not isinstance(given, str) or given not in _REDUCE_OPS:
        fix = (
            " Pass the name instead of a `torch.distributed.ReduceOp`."
            if type(op).__qualname__.startswith("ReduceOp")
            else ""
        )
        names = list(get_args(ReduceOpName))
        msg = f"`all_reduce` takes `op` in {names!r}, got {op!r}.{fix}"
        raise TypeError(msg)
    _check_group(group, name)
    cap = _cap_bytes(bucket_cap_mb, name)
    _agree(p, f"all_reduce(op={op!r}, bucket_cap_mb={bucket_cap_mb!r})", group, name)
    _check_plain(p, name)
    if op == "mean":
        _check_entries(
            p,
            name,
            is_float_or_complex,
            'floating-point or complex entries for `op="mean"`',
            'Reduce them with `op="sum"` and divide, or leave them out.',
        )
    elif op in ("max", "min", "product"):
        # torch.distributed reduces complex tensors by "sum" (and "mean") only.
        _check_entries(
            p,
            name,
            lambda v: not v.is_complex(),
            f'real entries for `op="{op}"`',
            "Reduce real and imaginary parts apart (`torch.view_as_real`), or "
            "leave them out.",
        )
    reduce_op = getattr(dist.ReduceOp, _REDUCE_OPS[op])
    values = list(p.values())
    out = list(values)
    size = dist.get_world_size(group)
    for bucket in _buckets.plan(values, cap):
        buffer = _buckets.pack(values, bucket)
        if bucket.numel:
            dist.all_reduce(buffer, op=reduce_op, group=group)  # pyright: ignore[reportUnknownMemberType]
            if op == "mean":
                buffer.div_(size)
        _buckets.unpack(buffer, bucket, values, out)
    return p._derive(out)


def broadcast(
    p: P,
    /,
    *,
    src: int = 0,
    group: dist.ProcessGroup | None = None,
    bucket_cap_mb: float = 25.0,
) -> P:
    """Return the values of process `src`, keyed like `p`, on every process.

    The keyed, coalesced form of `torch.distributed.broadcast`, for example to start
    every process from the same initial parameters. On the other processes `p` only
    supplies keys, shapes, dtypes and devices. `p` is unchanged everywhere, and the
    result (a copy on `src` too) does not require grad.

    Args:
        p: The values to send (on `src`) or the template to receive into. Every
            process passes the same keys, in the same order, with the same shapes,
            dtypes and devices.
        src: The global rank of the sending process, as for
            `torch.distributed.broadcast`.
        group: The process group; the default group when `None`.
        bucket_cap_mb: The largest flat buffer, in MiB.

    Returns:
        A new ParamDict of the same type, keys and order as `p`, holding `src`'s values.

    Raises:
        TypeError: If `p` is not a ParamDict, `src` is not an int, `group` is not a
            process group, or some entries are sparse tensors or DTensors (the
            message names them).
        ValueError: If no process group is initialized, this process is not in
            `group`, `src` is not in `group`, `bucket_cap_mb` is not positive, or
            the processes disagree on keys, order, shapes, dtypes, devices or
            options; the message names the keys and ranks, and every process
            raises it.

    Example:
        >>> import torch.distributed as dist
        >>> store = dist.HashStore()  # one process: no rendezvous needed
        >>> dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        >>> params = ParamDict(w=torch.tensor([1.0, 2.0]))
        >>> broadcast(params, src=0)["w"]
        tensor([1., 2.])
        >>> dist.destroy_process_group()
    """
    name = "broadcast"
    _check_paramdict(p, name)
    _check_group(group, name)
    cap = _cap_bytes(bucket_cap_mb, name)
    _agree(p, f"broadcast(src={src!r}, bucket_cap_mb={bucket_cap_mb!r})", group, name)
    # After `_agree`: every process passed this `src`, so all raise alike.
    _check_src(src, group)
    _check_plain(p, name)
    values = list(p.values())
    out = list(values)
    for bucket in _buckets.plan(values, cap):
        buffer = _buckets.pack(values, bucket)
        if bucket.numel:
            # Complex buffers travel as real pairs: gloo in torch 2.4 cannot
            # broadcast complex tensors. The view writes into `buffer`.
            real = torch.view_as_real(buffer) if buffer.is_complex() else buffer
            dist.broadcast(real, src=src, group=group)
        _buckets.unpack(buffer, bucket, values, out)
    return p._derive(out)


def all_gather(
    p: P,
    /,
    *,
    group: dist.ProcessGroup | None = None,
    bucket_cap_mb: float = 25.0,
) -> list[P]:
    """Return every process's values, one ParamDict per process, in group rank order.

    The keyed, coalesced form of `torch.distributed.all_gather`. Every process gets
    the same list; `p` is unchanged, and the results do not require grad.

    Args:
        p: The values of this process. Every process passes the same keys, in the
            same order, with the same shapes, dtypes and devices.
        group: The process group; the default group when `None`.
        bucket_cap_mb: The largest flat buffer of one process, in MiB.

    Returns:
        A list of `group`'s size of new ParamDicts of the same type, keys and order
        as `p`; item `i` holds the values of the process of group rank `i`.

    Raises:
        TypeError: If `p` is not a ParamDict, or some entries are sparse tensors or
            DTensors (the message names them).
        ValueError: If no process group is initialized, this process is not in
            `group`, `bucket_cap_mb` is not positive, or the processes disagree on
            keys, order, shapes, dtypes, devices or options; the message names the
            keys and ranks, and every process raises it. If some entries are meta
            tensors, which hold no values (named).

    Example:
        >>> import torch.distributed as dist
        >>> store = dist.HashStore()  # one process: no rendezvous needed
        >>> dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        >>> losses = ParamDict(task=torch.tensor([0.5, 0.25]))
        >>> [q["task"] for q in all_gather(losses)]
        [tensor([0.5000, 0.2500])]
        >>> dist.destroy_process_group()
    """
    name = "all_gather"
    _check_paramdict(p, name)
    _check_group(group, name)
    cap = _cap_bytes(bucket_cap_mb, name)
    _agree(p, f"all_gather(bucket_cap_mb={bucket_cap_mb!r})", group, name)
    _check_plain(p, name)
    values = list(p.values())
    size = dist.get_world_size(group)
    outs = [list(values) for _ in range(size)]
    for bucket in _buckets.plan(values, cap):
        buffer = _buckets.pack(values, bucket)
        rows = buffer.new_empty(size, bucket.numel)
        if bucket.numel:
            # Into views of `rows`: `all_gather` with a list of outputs is the one
            # gathering collective every supported torch has without a warning.
            dist.all_gather(list(rows.unbind(0)), buffer, group=group)  # pyright: ignore[reportUnknownMemberType]
        for rank, out in enumerate(outs):
            _buckets.unpack(rows[rank], bucket, values, out)
    return [p._derive(out) for out in outs]
