"""Backend registry: `@register_backend("fp4")` on a class, `get_backend("fp4")` for its shared instance."""

from __future__ import annotations

from trace_rl.backends.base import Backend

_CLASSES: dict[str, type[Backend]] = {}
_INSTANCES: dict[str, Backend] = {}


def register_backend(name: str):
    def deco(cls: type[Backend]) -> type[Backend]:
        cls.name = name
        _CLASSES[name] = cls
        return cls

    return deco


def get_backend(name: str) -> Backend:
    _load_builtin()
    if name not in _CLASSES:
        raise ValueError(f"unknown backend {name!r}; registered: {', '.join(sorted(_CLASSES))}")
    if name not in _INSTANCES:
        _INSTANCES[name] = _CLASSES[name]()
    return _INSTANCES[name]


def backend_names() -> list[str]:
    _load_builtin()
    return sorted(_CLASSES)


def backend_for_format(fmt: str) -> Backend:
    """The backend that computes with weights in `fmt`."""
    from trace_rl.plan import format_family

    return get_backend(format_family(fmt))


def _load_builtin() -> None:
    # Imported on first use so `import trace_rl` stays light.
    from trace_rl.backends import bf16, fp4, fp8, fp8_te  # noqa: F401
