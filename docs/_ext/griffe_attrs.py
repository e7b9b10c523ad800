"""Give attrs classes their constructor signature, for the API reference.

attrs writes a class's `__init__` when the class is created, so reading the
source finds no `__init__` and the reference would show the class with no
signature and no defaults. This extension imports each attrs class of the
package once it is loaded and adds an `__init__` built from the class's
fields: their names, the annotations as written in the source (aliases such
as `LearningRate` kept) and their defaults. With `merge_init_into_class` the
class heading then shows the constructor, as for a hand-written `__init__`.
"""

from __future__ import annotations

from typing import Any

import attrs
import griffe

_KEYWORD = griffe.ParameterKind("keyword-only")
_EITHER = griffe.ParameterKind("positional or keyword")


def _default(field: attrs.Attribute[Any]) -> str | None:
    """Return the default of `field` as code, or None if it has none."""
    default: Any = field.default
    if default is attrs.NOTHING:
        return None
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        factory: Any = default.factory  # pyright: ignore[reportUnknownMemberType]
        return f"{getattr(factory, '__name__', 'factory')}()"
    return repr(default)


def _annotation(
    cls: griffe.Class, name: str, field: attrs.Attribute[Any]
) -> Any:
    """Return the annotation of `name` as written, or the field's type."""
    member = cls.all_members.get(name)
    annotation = getattr(member, "annotation", None)
    if annotation is not None:
        return annotation
    if field.type is None:
        return None
    return getattr(field.type, "__name__", str(field.type))


def _constructor(cls: griffe.Class, runtime: type) -> griffe.Function:
    """Return an `__init__` with the parameters attrs gives `runtime`."""
    parameters = [griffe.Parameter("self", kind=_EITHER)]
    for field in attrs.fields(runtime):
        if not field.init:
            continue
        kind = _KEYWORD if field.kw_only else _EITHER
        parameters.append(
            griffe.Parameter(
                field.alias or field.name,
                annotation=_annotation(cls, field.name, field),
                kind=kind,
                default=_default(field),
            )
        )
    return griffe.Function(
        "__init__",
        parameters=griffe.Parameters(*parameters),
        returns="None",
        parent=cls,
    )


def _classes(module: griffe.Module) -> list[griffe.Class]:
    """Return the classes defined in `module` and its submodules."""
    found: list[griffe.Class] = []
    for member in module.members.values():
        if member.is_alias:
            continue
        if isinstance(member, griffe.Module):
            found.extend(_classes(member))
        elif isinstance(member, griffe.Class):
            found.append(member)
    return found


class AttrsConstructors(griffe.Extension):
    """Add the attrs-generated `__init__` to every attrs class of a package."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Give each attrs class of `pkg` without an `__init__` its own."""
        for cls in _classes(pkg):
            if "__init__" in cls.members:
                continue
            try:
                runtime = griffe.dynamic_import(cls.path)
            except ImportError:
                continue
            if isinstance(runtime, type) and attrs.has(runtime):
                cls.set_member("__init__", _constructor(cls, runtime))
