"""Answering the shell's completion requests (``meshctl completion SHELL`` installs the script).

Every <TAB> starts meshctl with ``_MESHCTL_COMPLETE=complete_<shell>`` and the words typed so far.
The answer comes from a description of the command tree (commands, options, their choices and
help) cached as JSON under ``$XDG_CACHE_HOME/meshctl``: built once from the real tree (typer and
every plugin imported, ~1 s), then read back while the installed code is unchanged, so a <TAB>
imports neither typer nor a plugin (tests/bench/bench_cli_help.py times it). The cache's stamp
covers meshctl's version, the interpreter, the import path's directories (a distribution
installed or removed) and every file of meshctl and of the plugins' packages; a frozen binary's
stamp is the binary itself.
Invariants: a request never prints anything but candidates (a mistyped word gets none, never an
``Error:`` line in the user's terminal) and never fails; values come from the same parsers the
options validate with (``values.Choice``, enums, ``a|b`` metavars).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

CACHE_FORMAT = 1
_CHOICES = re.compile(r"^[A-Za-z0-9_.-]+(?:\|[A-Za-z0-9_.-]+)+$")

Spec = dict[str, Any]  # {"help", "options": [...], "args": [...], "commands": {name: Spec}}
Item = tuple[str, str]  # a candidate and its help


def answer(env: Mapping[str, str], shell: str, out: Any = None) -> int:
    """Print the candidates for ``shell``'s request in ``env`` (``meshctl.entry`` saw the
    scripts' variable and names the shell); the exit status the shell expects."""
    out = out or sys.stdout
    try:
        args, incomplete = _request(shell, env)
        items = candidates(tree(), args, incomplete)
    except Exception:  # noqa: BLE001 -- a completion never shows an error in the terminal
        items = []
    if shell == "fish" and env.get("_TYPER_COMPLETE_FISH_ACTION") == "is-args":
        return 0 if items else 1  # no candidates: fish completes file names instead
    text = _format(shell, items)
    if text:
        out.write(text + "\n")
    return 0


# --- the shells' requests and answers (the protocol of typer's scripts) -----------------------


def _split(line: str) -> list[str]:
    """Words as the shell would split them, an unclosed quote ending the last word."""
    lexer = shlex.shlex(line, posix=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    words: list[str] = []
    try:
        words.extend(lexer)
    except ValueError:
        words.append(lexer.token)
    return words


def _request(shell: str, env: Mapping[str, str]) -> tuple[list[str], str]:
    """The words after ``meshctl`` before the one being completed, and that one."""
    if shell == "bash":
        words = _split(env.get("COMP_WORDS", ""))
        index = int(env.get("COMP_CWORD", "0"))
        return words[1:index], words[index] if index < len(words) else ""
    line = env.get("_TYPER_COMPLETE_ARGS", "")
    words = _split(line)[1:]
    if shell in {"powershell", "pwsh"}:
        incomplete = env.get("_TYPER_COMPLETE_WORD_TO_COMPLETE", "")
        return (words[:-1] if incomplete else words), incomplete
    if words and not line.endswith(" "):
        return words[:-1], words[-1]
    return words, ""


def _format(shell: str, items: list[Item]) -> str:
    if shell == "bash":
        return "\n".join(value for value, _ in items)
    if shell == "zsh":
        if not items:
            return "_files"
        rows = "\n".join(
            f'"{_zsh(value)}":"{_zsh(help_)}"' if help_ else f'"{_zsh(value)}"'
            for value, help_ in items
        )
        return f"_arguments '*: :(({rows}))'"
    if shell == "fish":
        return "\n".join(
            f"{value}\t{' '.join(help_.split())}" if help_ else value for value, help_ in items
        )
    if shell in ("powershell", "pwsh"):
        return "\n".join(f"{value}:::{help_ or ' '}" for value, help_ in items)
    return ""


def _zsh(text: str) -> str:
    return (
        text.replace('"', '""')
        .replace("'", "''")
        .replace("$", "\\$")
        .replace("`", "\\`")
        .replace(":", r"\\:")
    )


# --- candidates ------------------------------------------------------------------------------


def candidates(root: Spec, args: list[str], incomplete: str) -> list[Item]:
    """What may follow ``args``, starting with ``incomplete``, as click would offer it: a value
    of the option before it, option names after ``-``, else subcommands or an argument's
    choices. Global options may come anywhere (the root moves them, as kubectl's); after a
    mistyped command nothing is offered."""
    walked = _walk(root, args)
    if walked is None:
        return []
    node, pending, positional, ended = walked
    if pending is not None:
        return _values(pending, incomplete)
    if incomplete.startswith("-") and not ended:
        name, equals, value = incomplete.partition("=")
        if equals:
            return [(f"{name}={v}", h) for v, h in _values(_option(name, node, root), value)]
        return [
            (name, option["help"])
            for option in node.get("options", ())
            if not option.get("hidden")
            for name in option["names"]
            if name.startswith(incomplete)
        ]
    commands = node.get("commands") or {}
    if commands:
        return [
            (name, sub.get("help", ""))
            for name, sub in commands.items()
            if name.startswith(incomplete) and not sub.get("hidden")
        ]
    arguments = node.get("args") or []
    choices = arguments[positional] if positional < len(arguments) else []
    return [(c, "") for c in choices if c.startswith(incomplete)]


def _walk(root: Spec, args: list[str]) -> tuple[Spec, Spec | None, int, bool] | None:
    """Where ``args`` lead: the command, the option still waiting for its value, how many
    arguments were given, whether ``--`` ended the options; None after an unknown command."""
    node, pending, positional, ended = root, None, 0, False
    for word in args:
        if pending is not None:
            pending = None
        elif word == "--":
            ended = True
        elif word.startswith("-") and not ended and len(word) > 1:
            option = _option(word.partition("=")[0], node, root)
            if option is not None and option["value"] and "=" not in word:
                pending = option
        elif (commands := node.get("commands") or {}) and not ended:
            if word not in commands:
                return None
            node, positional = commands[word], 0
        else:
            positional += 1
    return node, pending, positional, ended


def _option(name: str, node: Spec, root: Spec) -> Spec | None:
    for where in (node, root):
        for option in where.get("options", ()):
            if name in option["names"]:
                found: Spec = option
                return found
    return None


def _values(option: Spec | None, prefix: str) -> list[Item]:
    if option is None:
        return []
    return [(choice, "") for choice in option.get("choices", ()) if choice.startswith(prefix)]


# --- the tree: cached, or built from the real commands --------------------------------------


def cache_path(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base) / "meshctl" / "completion.json"


def tree() -> Spec:
    """The command tree: the cached one while its stamp holds, else built (and cached)."""
    path = cache_path()
    with contextlib.suppress(OSError, ValueError):
        cached = json.loads(path.read_text(encoding="utf-8"))
        if cached.get("format") == CACHE_FORMAT and cached.get("stamp") == _stamp(
            cached.get("packages", [])
        ):
            return dict(cached["tree"])
    built, packages = build()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        data = {"format": CACHE_FORMAT, "packages": packages, "stamp": _stamp(packages)}
        temporary.write_text(json.dumps({**data, "tree": built}), encoding="utf-8")
        temporary.replace(path)
    return built


def _stamp(packages: list[str]) -> str:
    """What the cached tree was built from: changes when any of it does."""
    from meshctl import __version__

    digest = hashlib.sha256(f"{__version__}\0{sys.executable}".encode())
    if getattr(sys, "frozen", False):
        st = Path(sys.executable).stat()
        digest.update(f"{st.st_mtime_ns}:{st.st_size}".encode())
        return digest.hexdigest()
    for entry in sys.path:
        with contextlib.suppress(OSError):
            digest.update(f"{entry}:{Path(entry or '.').stat().st_mtime_ns}\0".encode())
    for folder in packages:
        for path, mtime, size in _files(folder):
            digest.update(f"{path}:{mtime}:{size}\0".encode())
    return digest.hexdigest()


def _files(folder: str) -> Iterator[tuple[str, int, int]]:
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            if entry.is_dir(follow_symlinks=False):
                if entry.name != "__pycache__":
                    yield from _files(entry.path)
            elif entry.name.endswith((".py", ".json")):
                st = entry.stat()
                yield entry.path, st.st_mtime_ns, st.st_size


def build() -> tuple[Spec, list[str]]:
    """The tree from the real commands (imports typer and every plugin), and the package
    folders whose files the stamp covers."""
    import importlib.util

    from typer import _click as click
    from typer.main import get_command

    from meshctl import cli
    from meshctl.errors import MeshctlError

    root: Any = get_command(cli.app)  # cli.PluginGroup
    context = click.Context(root, info_name="meshctl")
    spec = _spec(root, context)
    spec["commands"] = {}
    packages = {str(Path(__file__).parent)}
    for name, info in sorted(root.plugins.items()):
        try:
            command = root.get_command(context, name)
        except MeshctlError:  # a plugin that does not load: its name still completes
            command = None
        if command is None:
            spec["commands"][name] = {"help": info.help, "hidden": info.hidden, "options": []}
            continue
        child = _spec(command, click.Context(command, info_name=name, parent=context))
        child["help"] = info.help
        child["hidden"] = info.hidden
        spec["commands"][name] = child
        found = importlib.util.find_spec(info.target.partition(":")[0].split(".")[0])
        packages.update((found.submodule_search_locations or []) if found else [])
    return spec, sorted(packages)


def _spec(command: Any, context: Any) -> Spec:
    """One command's options, arguments and subcommands, as plain data."""
    options: list[Spec] = []
    arguments: list[list[str]] = []
    for param in command.get_params(context):
        if param.param_type_name == "argument":
            arguments.extend([_choices(param)] * max(1, param.nargs))
            continue
        options.append(
            {
                "names": [*param.opts, *param.secondary_opts],
                "value": not param.is_flag and not param.count,
                "choices": _choices(param),
                "help": _first_line(param.help or ""),
                "hidden": bool(param.hidden),
            }
        )
    spec: Spec = {"help": command.get_short_help_str(limit=80), "options": options}
    if arguments:
        spec["args"] = arguments
    subcommands = getattr(command, "commands", None)
    if subcommands:
        spec["commands"] = {
            name: {
                **_spec(sub, type(context)(sub, info_name=name, parent=context)),
                "hidden": bool(sub.hidden),
            }
            for name, sub in sorted(subcommands.items())
        }
    return spec


def _choices(param: Any) -> list[str]:
    """The values a parameter accepts when they are a fixed set: its ``values.Choice`` parser,
    a click Choice (enums, literals), or a metavar that lists them (``default|ambient``)."""
    parse = getattr(getattr(param.type, "func", None), "meshctl_parse", None)
    if parse is not None and hasattr(parse, "choices"):
        return [str(c) for c in parse.choices]
    fixed = getattr(param.type, "choices", None)
    if fixed:
        return [str(getattr(c, "value", c)) for c in fixed]
    metavar = param.metavar or ""
    return metavar.split("|") if _CHOICES.match(metavar) else []


def _first_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 100 else line[:97] + "..."
