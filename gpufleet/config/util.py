"""Shared config helpers: TOML reading, pydantic errors as ConfigError, deep merge, path and name checks."""

from __future__ import annotations

import copy
import json
import posixpath
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, get_args

from pydantic import BaseModel, BeforeValidator, ValidationError, ValidationInfo

from gpufleet.errors import ConfigError

NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_TOML_AT = re.compile(r"\(at line (\d+), column (\d+)\)")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # no sane path holds one; some end a line
_TOML_TWICE = re.compile(r"Cannot declare \((.*)\) twice")


def read_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file; a missing file or bad syntax becomes a ConfigError naming file and line."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(str(p), "file does not exist")
    if not p.is_file():
        raise ConfigError(str(p), "is not a regular file")
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise _toml_error(p, exc) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(p), f"cannot read file: {exc}") from None


def _toml_error(path: Path, exc: tomllib.TOMLDecodeError) -> ConfigError:
    text = str(exc)
    at = _TOML_AT.search(text)
    where = f" at line {at.group(1)}" if at else ""
    twice = _TOML_TWICE.search(text)
    if twice:
        keys = [k.strip().strip("'\"") for k in twice.group(1).split(",") if k.strip()]
        table = ".".join(keys)
        host = keys[1] if len(keys) > 1 and keys[0] == "hosts" else None
        if len(keys) == 2 and host:
            return ConfigError(str(path), f"host is defined twice (second [{table}]{where})", host=host)
        return ConfigError(str(path), f"table [{table}] is defined twice (second one{where})", host=host)
    return ConfigError(str(path), f"invalid TOML{where}: {_TOML_AT.sub('', text).strip()}")


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """A new dict: tables merge key by key, every other value (lists included) is replaced."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def key_text(key: object) -> str:
    """A TOML key as a field name shows it: bare when TOML allows, else quoted ("" for the empty key)."""
    text = str(key)
    return text if _BARE_KEY.match(text) else json.dumps(text)


def dotted(loc: tuple[Any, ...]) -> str:
    """('server', 'extra_args', 0) -> 'server.extra_args[0]'; a key TOML cannot write bare is quoted."""
    text = ""
    for part in loc:
        if part == "[key]":  # pydantic marks a bad dict key this way; the key itself is the previous part
            continue
        text += f"[{part}]" if isinstance(part, int) else (f".{key_text(part)}" if text else key_text(part))
    return text


def model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The nested model class reached by following loc's names from model (None if it leaves models)."""
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        nested = _as_model(field.annotation) if field else None
        if nested is None:
            return None
        model = nested
    return model


def _as_model(tp: Any) -> type[BaseModel] | None:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    for arg in get_args(tp):
        found = _as_model(arg)
        if found:
            return found
    return None


def unknown_key_problem(allowed: list[str] | None) -> str:
    return "unknown key" + (f"; allowed keys: {', '.join(allowed)}" if allowed else "")


def validation_error(exc: ValidationError, path: str | Path, model: type[BaseModel], *,
                     host: str | None = None, prefix: tuple[Any, ...] = ()) -> ConfigError:
    """The first pydantic error as one ConfigError (file, host, dotted field, value); never pydantic's dump."""
    err = exc.errors(include_url=False)[0]
    loc = tuple(err["loc"])
    field = dotted(prefix + loc) or None
    if err["type"] == "extra_forbidden":
        parent = model_at(model, loc[:-1])
        allowed = list(parent.model_fields) if parent else None
        return ConfigError(str(path), unknown_key_problem(allowed), host=host, field=field,
                           value=err["input"], has_value=True)
    if err["type"] == "missing":
        return ConfigError(str(path), "required field is missing", host=host, field=field)
    msg = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
    value = err.get("input")
    return ConfigError(str(path), msg, host=host, field=field, value=value, has_value=value is not None)


def check_name(value: object, what: str) -> str:
    """A host or group name: letters, digits, '_', '.', '-' (no leading '.'/'-'), and not the word 'all'."""
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise ValueError(f"{what} name must use only letters, digits, '_', '.', '-' and not start with '.' or '-'")
    if value == "all":
        raise ValueError(f"'all' is reserved (it selects every host) and cannot be a {what} name")
    return value


def _remote_abs(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string path")
    if not value.startswith("/"):
        raise ValueError("must be an absolute path (the remote side does not expand '~' or relative paths)")
    if _CONTROL.search(value):
        raise ValueError("must not contain control characters (newlines, NUL, escapes): every command on the host "
                         "names it")
    return posixpath.normpath(value).replace("//", "/")


def _local_path(value: object, info: ValidationInfo) -> Path:
    # Relative paths are read relative to the file that names them, not the current directory.
    if not isinstance(value, (str, Path)) or str(value) == "":
        raise ValueError("must be a non-empty string path")
    if _CONTROL.search(str(value)):
        raise ValueError("must not contain control characters (newlines, NUL, escapes)")
    try:
        p = Path(value).expanduser()
    except RuntimeError:  # ~user of a user this machine does not have
        raise ValueError("names the home directory of a user this machine does not have") from None
    if not p.is_absolute():
        base = (info.context or {}).get("base_dir")
        if base is None:  # built in code, not loaded from a file: nothing to be relative to yet
            return p
        p = Path(base) / p
    return Path(posixpath.normpath(p))


RemotePath = Annotated[str, BeforeValidator(_remote_abs)]
LocalPath = Annotated[Path, BeforeValidator(_local_path)]
