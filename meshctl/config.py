"""Settings: the one place environment variables and settings files are read.

Every settings class is a frozen dataclass whose fields name their env var in metadata. ``resolve``
builds one from three sources with a fixed precedence: flags > env > file > default. A value that
cannot be used raises ``ConfigError`` naming the source (flag, env var or file) and the value.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from meshctl import values
from meshctl.errors import ConfigError

T = TypeVar("T")

CONFIG_ENV = "MESHCTL_CONFIG"
STATE_ENV = "XDG_STATE_HOME"
DEFAULT_CONFIG_PATH = Path("~/.config/meshctl/config.yaml")

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")


def setting(
    default: Any = None,
    *,
    env: str | tuple[str, ...] | None = None,
    flag: str | None = None,
    choices: tuple[str, ...] | None = None,
    parse: Callable[[Any], Any] | None = None,
    hint: str | None = None,
) -> Any:
    """A dataclass field that knows its env var(s), its flag spelling and its allowed values.

    ``env`` may name aliases (the first one set wins, in order), as Istio reads both
    ``REDIRECT_DNS`` and ``ISTIO_META_DNS_CAPTURE``. ``parse`` turns a raw value into the field's
    value (raising ``ValueError`` with a short reason) instead of the type-driven coercion;
    ``hint`` is the ``Hint:`` line shown when that fails.
    """
    return field(
        default=default,
        metadata={"env": env, "flag": flag, "choices": choices, "parse": parse, "hint": hint},
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class GlobalSettings:
    """Options every subcommand shares; built once by the root command."""

    debug: bool = setting(False, env="MESHCTL_DEBUG", flag="--debug")
    # None: the command's own default (warning; info for daemons, see meshctl.logs).
    log_level: str | None = setting(
        None, env="MESHCTL_LOG_LEVEL", flag="--log-level", choices=LOG_LEVELS
    )
    log_format: str = setting(
        "text", env="MESHCTL_LOG_FORMAT", flag="--log-format", choices=LOG_FORMATS
    )
    kubeconfig: str | None = setting(None, env="KUBECONFIG", flag="--kubeconfig")
    context: str | None = setting(None, env="MESHCTL_CONTEXT", flag="--context")
    config_file: str | None = setting(None, env=CONFIG_ENV, flag="--config")
    # kubectl's --request-timeout: one API request's limit in seconds; 0 waits forever.
    request_timeout: float = setting(
        30.0,
        env="MESHCTL_REQUEST_TIMEOUT",
        flag="--request-timeout",
        parse=values.Duration(),
        hint=f"give a duration, {values.DURATION_EXAMPLES}, or 0 for no limit",
    )


def resolve(
    cls: type[T],
    *,
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    file: Mapping[str, Any] | None = None,
    file_name: str = "config file",
) -> T:
    """Build ``cls`` from flags > env > file > defaults. ``None`` in ``flags`` means "not given"."""
    flags = flags or {}
    env = os.environ if env is None else env
    file = file or {}
    hints = typing.get_type_hints(cls)
    resolved: dict[str, object] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        meta = f.metadata
        flag_name = meta.get("flag") or "--" + f.name.replace("_", "-")
        env_names = meta.get("env") or ()
        env_name = next(
            (n for n in ((env_names,) if isinstance(env_names, str) else env_names) if env.get(n)),
            None,
        )
        if flags.get(f.name) is not None:
            raw, source = flags[f.name], f"flag {flag_name}"
        elif env_name is not None:
            raw, source = env[env_name], f"env {env_name}"
        elif f.name.replace("_", "-") in file or f.name in file:
            key = f.name.replace("_", "-") if f.name.replace("_", "-") in file else f.name
            raw, source = file[key], f"{file_name} key {key!r}"
        else:
            continue
        resolved[f.name] = _coerce(
            raw, hints[f.name], meta.get("choices"), source, meta.get("parse"), meta.get("hint")
        )
    unknown = sorted(
        set(file)
        - {
            n
            for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            for n in (f.name, f.name.replace("_", "-"))
        }
    )
    if unknown:
        raise ConfigError(
            f"{file_name}: unknown key(s) {', '.join(unknown)}",
            hint="check the spelling against 'meshctl --help'",
        )
    return cls(**resolved)


def env_with_prefix(prefix: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every variable named ``<prefix><K>``, as ``K -> value`` (Istio's ``ISTIO_META_*`` and
    ``XDS_HEADER_*`` families), in name order."""
    env = os.environ if env is None else env
    return {
        k[len(prefix) :]: v for k, v in sorted(env.items()) if k.startswith(prefix) and k != prefix
    }


def load_file(
    path: str | None, *, env: Mapping[str, str] | None = None
) -> tuple[dict[str, object], str]:
    """Read the settings file: ``path``, else ``$MESHCTL_CONFIG``, else the default if it exists.

    Returns the mapping and a name for messages. A file named explicitly must exist.
    """
    env = os.environ if env is None else env
    explicit = path or env.get(CONFIG_ENV) or None
    target = Path(explicit).expanduser() if explicit else DEFAULT_CONFIG_PATH.expanduser()
    if not explicit and not _is_file(target):
        return {}, str(target)
    from meshctl import inputs, yamlread  # deferred: most invocations have no settings file
    from meshctl.structured import InputError

    try:
        limits = inputs.limits(env)
        data = yamlread.load_yaml(
            inputs.read_bytes(target, str(target), limits), str(target), limits
        )
    except OSError as exc:
        raise ConfigError(
            f"cannot read settings file {target}: {exc.strerror or exc}",
            hint=f"fix the path given by --config or ${CONFIG_ENV}",
        ) from exc
    except InputError as exc:
        raise ConfigError(exc.message, hint=exc.hint) from exc
    if data is None:
        return {}, str(target)
    if not isinstance(data, dict):
        raise ConfigError(
            f"settings file {target} must hold a mapping, not {type(data).__name__}",
            hint="write 'key: value' lines, e.g. 'log-level: info'",
        )
    return data, str(target)


def _is_file(path: Path) -> bool:
    """Whether the default settings file is there; an unreadable home (a container running as
    another uid, a read-only or foreign HOME) counts as no file, not as a crash: nobody asked
    for this file by name."""
    try:
        return path.is_file()
    except OSError:
        return False


SETTINGS_FILE_META = "meshctl.settings_file"


def file_section(meta: Mapping[str, Any], name: str) -> tuple[dict[str, object], str]:
    """A subcommand's section of the settings file the root command loaded, and its name.

    ``meta`` is the click context's ``meta`` mapping (shared by every nested command).
    """
    data, file_name = meta.get(SETTINGS_FILE_META, ({}, "config file"))
    return section(data, name, file_name), f"{file_name} section {name!r}"


def section(data: Mapping[str, object], name: str, file_name: str) -> dict[str, object]:
    """The mapping under ``name`` in a settings file (a subcommand's own settings)."""
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(
            f"{file_name}: section {name!r} must be a mapping",
            hint=f"write '{name}:' followed by indented 'key: value' lines",
        )
    return value


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _coerce(
    raw: Any,
    hint: Any,
    choices: tuple[str, ...] | None,
    source: str,
    parser: Callable[[Any], Any] | None = None,
    usage: str | None = None,
) -> Any:
    """Turn a raw flag/env/file value into the field's type, or explain why it cannot be."""
    target = _strip_optional(hint)
    try:
        if parser is not None:
            value: Any = parser(raw)
        elif target is bool:
            value = _to_bool(raw)
        elif target is int:
            value = _to_int(raw)
        elif target is str:
            value = _to_str(raw)
        elif typing.get_origin(target) is tuple:
            items = raw.split(",") if isinstance(raw, str) else list(raw)
            value = tuple(str(i).strip() for i in items if str(i).strip())
        else:
            value = raw
    except (ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"{source}: invalid value {raw!r}: {exc}",
            hint=usage or "see 'meshctl --help' for the expected form",
        ) from exc
    if choices is not None and value not in choices:
        raise ConfigError(
            f"{source}: invalid value {raw!r}", hint=f"use one of: {', '.join(choices)}"
        )
    return value


def _to_int(raw: Any) -> int:
    if isinstance(raw, bool):  # YAML's `true` is an int subclass, never a port or a count
        raise TypeError("expected an integer")
    return int(raw)


def _to_str(raw: Any) -> str:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise TypeError("expected a string")
    return str(raw)


def _to_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("expected true or false")


def _strip_optional(hint: Any) -> Any:
    """``X | None`` -> ``X``; other hints unchanged."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration(value: str, name: str) -> float:
    """Seconds in a duration as Go (and kubectl) write them: ``5m``, ``1h30m``, ``300ms``,
    ``5m0s``, plus days (``7d``); a bare number is seconds. ``name`` is the flag for messages."""
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pos, seconds = 0, 0.0
        for match in _DURATION.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            pos = match.end()
        if pos != len(text) or not text:
            raise ConfigError(
                f"{name}: {value!r} is not a duration", hint="write e.g. 90s, 5m or 1h30m"
            ) from None
    if seconds < 0 or not math.isfinite(seconds):  # float() reads 'nan' and 'inf' too
        raise ConfigError(
            f"{name}: {value!r} is not a duration", hint="write e.g. 90s, 5m or 1h30m"
        )
    return seconds


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where meshctl keeps files a user may want back (copies of objects it replaced):
    ``$XDG_STATE_HOME/meshctl``, else ``~/.local/state/meshctl``."""
    env = os.environ if env is None else env
    base = env.get(STATE_ENV) or str(Path("~/.local/state").expanduser())
    return Path(base) / "meshctl"


def values_files(sources: Sequence[tuple[str, str]]) -> list[tuple[str, Any]]:
    """Each ``-f`` values source (its name, its text) as (its name, its one YAML document or
    None when empty), read by the bounded reader."""
    from meshctl import inputs, yamlread
    from meshctl.structured import InputError

    limits = inputs.limits()
    loaded = []
    for name, text in sources:
        try:
            loaded.append((name, yamlread.load_yaml(text, name, limits)))
        except InputError as exc:
            raise ConfigError(exc.message, hint=exc.hint) from exc
    return loaded
