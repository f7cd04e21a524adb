"""The config base every trace_rl config derives from: strict, frozen, documented, YAML/TOML round-trip.

- `extra="forbid"`: an unknown key is an error naming it.
- `allow_inf_nan=False`: a non-finite number (`.inf`, `nan`, `Infinity`) in any float field is an error
  naming it; an infinite learning rate would otherwise validate and train every weight to NaN.
- frozen: a config is a value; derive variants with `cfg.model_copy(update=...)` or `with_overrides`.
- every field carries a `description` (tests check this for every config class).
- `ConfigError` turns pydantic's errors into one line per field: `path.to.field: what is wrong`.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Self

import tomli_w
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class ConfigError(ValueError):
    """Invalid configuration. `str()` names each bad field, the value given and what is allowed."""

    def __init__(self, message: str, fields: tuple[str, ...] = ()):
        super().__init__(message)
        self.fields = fields

    @classmethod
    def from_validation(cls, err: ValidationError, source: str | None = None) -> ConfigError:
        lines, fields = [], []
        for e in err.errors():
            loc = ".".join(str(p) for p in e["loc"]) or "<root>"
            fields.append(loc)
            msg = e["msg"].removeprefix("Value error, ")
            if e["type"] == "extra_forbidden":
                msg = "unknown key (not a field of this config; check the spelling)"
            elif "input" in e and e["type"] not in ("missing", "value_error"):
                msg = f"{msg} (got {e['input']!r})"
            lines.append(f"  {loc}: {msg}")
        head = f"invalid config{f' in {source}' if source else ''}:"
        if len(lines) == 1:                      # one bad field: one line
            return cls(f"{head} {lines[0].strip()}", tuple(fields))
        return cls("\n".join([head, *lines]), tuple(fields))


class TraceConfig(BaseModel):
    """Base class of all trace_rl configs."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)

    # -- construction with readable errors --
    @classmethod
    def parse(cls, data: dict[str, Any], source: str | None = None) -> Self:
        try:
            return cls.model_validate(data)
        except ValidationError as err:
            raise ConfigError.from_validation(err, source) from None

    @classmethod
    def from_yaml(cls, text: str, source: str | None = None) -> Self:
        data = parse_yaml(text, source or "<string>")
        if not isinstance(data, dict):
            raise ConfigError(f"invalid config{f' in {source}' if source else ''}: top level must be a mapping")
        return cls.parse(data, source)

    @classmethod
    def from_toml(cls, text: str, source: str | None = None) -> Self:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"invalid TOML{f' in {source}' if source else ''}: {err}") from None
        return cls.parse(data, source)

    @classmethod
    def load(cls, path: str | Path) -> Self:
        """Load a `.yaml`/`.yml`, `.toml` or `.json` file."""
        return cls.parse(read_config_file(path), str(path))

    # -- serialisation (None is left out: TOML has no null, and None is every optional field's default) --
    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())

    def dump(self, path: str | Path) -> Path:
        path = Path(path)
        text = self.to_toml() if path.suffix.lower() == ".toml" else self.to_yaml()
        path.write_text(text)
        return path

    def with_overrides(self, overrides: dict[str, Any]) -> Self:
        """A copy with dotted-key overrides applied, re-validated: `{"rollout.sampling.temperature": 0.7}`;
        a number indexes a list (`{"corrections.0.params.C": 3}`)."""
        data = self.to_dict()
        for key, value in overrides.items():
            set_dotted(data, key, value)
        return type(self).parse(data, "overrides")


def parse_yaml(text: str, source: str) -> Any:
    """yaml.safe_load, with a syntax error turned into one ConfigError line naming the file, line and column."""
    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{where}: invalid YAML ({problem}); fix the syntax there (indentation, ':' after "
                          f"each key, matching quotes and brackets)") from None


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The raw mapping of a `.yaml`/`.yml`, `.toml` or `.json` config file. Every way the file can be unusable
    (missing, a folder, unreadable, not UTF-8, a syntax error, not a mapping) is a one-line ConfigError that
    names the file (and the line, for syntax errors)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    if not path.is_file():
        raise ConfigError(f"config file {path}: is a folder, not a file; give a .yaml, .toml or .json file")
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml", ".json"):
        raise ConfigError(f"config file {path}: unknown suffix {suffix!r}; use .yaml, .yml, .toml or .json")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path}: not UTF-8 text (byte {err.start}: {err.reason}); save it as "
                          f"UTF-8") from None
    except OSError as err:
        raise ConfigError(f"config file {path}: cannot be read ({err.strerror or err})") from None
    if suffix in (".yaml", ".yml"):
        data = parse_yaml(text, str(path))
    elif suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path}: invalid TOML ({err}); fix the syntax there") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}:{err.lineno}:{err.colno}: invalid JSON ({err.msg}); fix the syntax "
                              f"there") from None
    if not isinstance(data, dict):
        raise ConfigError(f"invalid config in {path}: top level must be a mapping (key: value), got "
                          f"{type(data).__name__}")
    return data


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `a.b.0.c` in nested dicts/lists, in place. Missing sections are created; a list index must exist."""
    parts = key.split(".")
    if not all(parts):
        raise ConfigError(f"invalid override {key!r}: empty name between dots", (key,))
    node: Any = data
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = ".".join(parts[:depth]) or "<root>"
        if isinstance(node, list):
            if not part.isdigit():
                raise ConfigError(f"invalid override {key}: {where} is a list; index it with a number, e.g. "
                                  f"{where}.0", (key,))
            index = int(part)
            if index >= len(node):
                raise ConfigError(f"invalid override {key}: {where} has {len(node)} entries (indices 0.."
                                  f"{len(node) - 1}); to change its length set the whole list, e.g. "
                                  f"--set '{where}=[...]'", (key,))
            if last:
                node[index] = value
            else:
                node = node[index]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                if node.get(part) is None:
                    if parts[depth + 1].isdigit():
                        raise ConfigError(f"invalid override {key}: {'.'.join(parts[:depth + 1])} is not set, so it "
                                          f"has no entry {parts[depth + 1]}; set the whole list, e.g. "
                                          f"--set '{'.'.join(parts[:depth + 1])}=[...]'", (key,))
                    node[part] = {}
                node = node[part]
        else:
            raise ConfigError(f"invalid override {key}: {where} is a value ({node!r}), not a section or list",
                              (key,))


def undocumented_fields(cls: type[BaseModel]) -> list[str]:
    """Fields of `cls` (recursively through nested configs) without a description: used by tests."""
    missing = []
    for name, field in cls.model_fields.items():
        if not field.description:
            missing.append(f"{cls.__name__}.{name}")
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            missing += undocumented_fields(ann)
    return missing
