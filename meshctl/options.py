"""The shared CLI grammar: option definitions every plugin uses, and the rules behind them.

One spelling per meaning on every command (docs/cli.md): ``-o/--output json|yaml|table|name``
for data, ``-O/--output-file`` for a file, ``-n/--namespace``, ``-f/--filename`` (``-``, files,
directories), ``--dry-run``, ``--color``; typed options (ports, durations, counts, addresses,
paths) that are validated while the command line is parsed, before the command does anything,
with the allowed range in the message and the type in the help metavar; env vars shown in help
as ``[env NAME]``. Options given on a group reach the subcommand's option of the same name, or
are refused (exit 2): ``hold_group_options``. Imports typer: plugin CLI modules use it, the
core never does.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer import _click as click
from typer._click.core import ParameterSource
from typer._click.exceptions import BadParameter, UsageError
from typer._click.globals import get_current_context
from typer.core import TyperCommand, TyperGroup

from meshctl import inputs, logs, values
from meshctl.config import GlobalSettings
from meshctl.errors import MeshctlError, UserError
from meshctl.output import FORMATS, OutputFormat
from meshctl.structured import Limits, decode
from meshctl.terminal import COLOR_CHOICES

if TYPE_CHECKING:
    from meshctl.kube.client import KubeSettings

# What -f reads from a directory (kubectl's extensions).
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


def command_app(**settings: Any) -> typer.Typer:
    """A plugin's Typer app with the house's settings: no completion options of its own (the
    ``completion`` command serves every shell), no rich tracebacks or markup (errors are
    ``Error:``/``Hint:`` lines, help is plain text); ``settings``: Typer's others (``help``,
    ``no_args_is_help``, ``invoke_without_command`` ...)."""
    return typer.Typer(
        add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None, **settings
    )


def env_help(help: str, env: str | Sequence[str] | None) -> str:  # noqa: A002 (click's name)
    """``help`` with the env var(s) that set the option, as every option shows them."""
    names = [env] if isinstance(env, str) else list(env or ())
    return f"{help} [env {', '.join(names)}]" if names else help


def typed(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A typer ``parser`` from a ``meshctl.values`` parser: its ``ValueError`` becomes a usage
    error naming the flag (click attaches the parameter), so bad input exits 2 before the
    command body runs."""

    def parser(raw: Any) -> Any:
        try:
            return parse(raw)
        except ValueError as exc:
            raise BadParameter(str(exc)) from None

    parser.__name__ = f"parse_{type(parse).__name__.lower()}"
    parser.meshctl_parse = parse  # type: ignore[attr-defined]  # the tree test reads it
    return parser


def option(
    *names: str,
    help: str,  # noqa: A002 (click's name)
    metavar: str | None = None,
    parse: Callable[[Any], Any] | None = None,
    env: str | Sequence[str] | None = None,
    **kwargs: Any,
) -> Any:
    """A ``typer.Option``: the parser's metavar unless given, the env var(s) in the help."""
    if parse is not None:
        kwargs["parser"] = typed(parse)
        metavar = metavar or getattr(parse, "metavar", None)
    return typer.Option(*names, help=env_help(help, env), metavar=metavar, **kwargs)


def port(*names: str, help: str, env: str | Sequence[str] | None = None, **kw: Any) -> Any:  # noqa: A002
    return option(*names, help=help, parse=values.PORT, env=env, **kw)


def duration(
    *names: str,
    help: str,  # noqa: A002
    positive: bool = False,
    minimum: float = 0.0,
    maximum: float | None = None,
    whole: bool = False,
    env: str | Sequence[str] | None = None,
    **kw: Any,
) -> Any:
    parse = values.Duration(positive=positive, minimum=minimum, maximum=maximum, whole=whole)
    return option(*names, help=help, parse=parse, env=env, **kw)


def count(
    *names: str,
    help: str,  # noqa: A002
    minimum: int | None = 0,
    maximum: int | None = None,
    metavar: str = "N",
    env: str | Sequence[str] | None = None,
    **kw: Any,
) -> Any:
    parse = values.Integer(minimum, maximum, metavar=metavar)
    return option(*names, help=help, parse=parse, env=env, **kw)


def address(*names: str, help: str, env: str | Sequence[str] | None = None, **kw: Any) -> Any:  # noqa: A002
    return option(*names, help=help, parse=values.ADDRESS, env=env, **kw)


def choice(
    *names: str,
    choices: Sequence[str],
    help: str,  # noqa: A002
    env: str | Sequence[str] | None = None,
    **kw: Any,
) -> Any:
    return option(*names, help=help, parse=values.Choice(tuple(choices)), env=env, **kw)


class ExistingFile:
    """A path that must name a readable file (certificates, CA bundles, configs)."""

    __slots__ = ()
    metavar = "FILE"

    def __call__(self, raw: Any) -> Path:
        path = Path(raw).expanduser()
        if not path.exists():
            raise ValueError(f"{str(raw)!r} does not exist")
        if not path.is_file():
            raise ValueError(f"{str(raw)!r} is not a file")
        return path


class OutputDirectory:
    """A directory to write into: it may be missing (it is created), but not a file."""

    __slots__ = ()
    metavar = "DIR"

    def __call__(self, raw: Any) -> Path:
        path = Path(raw).expanduser()
        if path.exists() and not path.is_dir():
            raise ValueError(f"{str(raw)!r} is a file, not a directory")
        return path


class OutputFile:
    """A file to (re)write: its directory must exist, and it must not be a directory itself."""

    __slots__ = ()
    metavar = "FILE"

    def __call__(self, raw: Any) -> Path:
        if isinstance(raw, Path):
            raw = str(raw)  # already parsed (handed down from a group): parse it again
        if not str(raw).strip():
            raise ValueError("the path is empty; name the file to write")
        path = Path(raw).expanduser()
        if path.is_dir():
            raise ValueError(f"{str(raw)!r} is a directory, not a file")
        if not path.parent.is_dir():
            raise ValueError(f"{str(path.parent)!r} is not an existing directory")
        return path


def existing_file(*names: str, help: str, env: str | Sequence[str] | None = None, **kw: Any) -> Any:  # noqa: A002
    return option(*names, help=help, parse=ExistingFile(), env=env, **kw)


def output_directory(
    *names: str,
    help: str,  # noqa: A002
    env: str | Sequence[str] | None = None,
    **kw: Any,
) -> Any:
    return option(*names, help=help, parse=OutputDirectory(), env=env, **kw)


def from_setting(
    cls: type[Any],
    field_name: str,
    *names: str,
    help: str,  # noqa: A002
    metavar: str | None = None,
    raw: bool = False,
    **kw: Any,
) -> Any:
    """The option that sets ``cls.field_name`` (a ``meshctl.config.setting``): its flag names,
    env var(s), allowed choices and parser come from the field, so help and resolution agree.
    The value is parsed while the command line is (``raw``: left as typed, for settings whose
    own parser names the flag in its message) and ``config.resolve`` then applies flag > env >
    file > default."""
    field = next(f for f in dataclasses.fields(cls) if f.name == field_name)
    meta = field.metadata
    flags = names or tuple((meta.get("flag") or "--" + field_name.replace("_", "-")).split("/"))
    parse = meta.get("parse")
    choices = meta.get("choices")
    if parse is None and choices:
        parse = values.Choice(tuple(choices))
    if raw and parse is not None:
        metavar = metavar or getattr(parse, "metavar", None)
        parse = None
    kw.setdefault("show_default", False)
    return option(*flags, help=help, metavar=metavar, parse=parse, env=meta.get("env"), **kw)


# --- the shared options themselves ------------------------------------------------------------

OUTPUT_HELP = f"Output format: {'|'.join(FORMATS)}."


def output(*, short: bool = True, why_not_o: str = "") -> Any:
    """``-o/--output``; ``short=False`` on commands whose ``-o`` keeps istio-iptables' meaning,
    and then ``why_not_o`` tells the help why."""
    names = ("-o", "--output") if short else ("--output",)
    text = OUTPUT_HELP + (f" ({why_not_o})" if why_not_o else "")
    return typer.Option(*names, help=text, metavar="|".join(FORMATS), case_sensitive=False)


OutputOption = Annotated[OutputFormat, output()]
OutputFileOption = Annotated[
    Path | None,
    option(
        "-O",
        "--output-file",
        parse=OutputFile(),
        help="Write the output to FILE (replaced atomically) instead of stdout.",
        show_default=False,
    ),
]


def namespace(help: str = "Kubernetes namespace.") -> Any:  # noqa: A002
    return typer.Option("-n", "--namespace", metavar="NAME", help=help)


# The image a manifest command writes into its pods (None: this version's).
ImageOption = Annotated[
    str | None,
    typer.Option("--image", metavar="IMAGE", help="meshctl image (default: this version's)."),
]


def filename(help: str) -> Any:  # noqa: A002
    """``-f/--filename``: files, directories of .yaml/.yml/.json files, or ``-`` (stdin)."""
    return typer.Option("-f", "--filename", metavar="FILE|DIR|-", help=help, show_default=False)


FilenameOption = Annotated[
    list[str] | None,
    filename("Manifest file, directory of .yaml/.yml/.json files, or - for stdin; repeatable."),
]
RecursiveOption = Annotated[
    bool,
    typer.Option("-R", "--recursive", help="Read directories given with -f recursively."),
]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Print what would change; change nothing.")
]
# For commands that talk to an API server: kubectl's --dry-run=none|client|server; given
# without a value it is client (as kubectl took it), which needs ``DryRunCommand``.
DRY_RUN_MODES = ("none", "client", "server")
DryRunModeOption = Annotated[
    str,
    option(
        "--dry-run",
        parse=values.Choice(DRY_RUN_MODES),
        help="client (also --dry-run alone): print what would be sent; server: the API server "
        "checks and defaults every object and persists nothing; none: do it.",
    ),
]


class DryRunCommand(TyperCommand):
    """A command whose ``--dry-run`` may come without a value (kubectl's old spelling): then
    it is ``--dry-run=client``; ``--dry-run server`` and ``--dry-run=server`` both take the mode.
    (typer's click has no optional option values.)"""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        out: list[str] = []
        for index, word in enumerate(args):
            if word == "--":
                out += args[index:]
                break
            following = args[index + 1] if index + 1 < len(args) else None
            bare = word == "--dry-run" and following not in DRY_RUN_MODES
            out.append("--dry-run=client" if bare else word)
        return super().parse_args(ctx, out)


ColorOption = Annotated[
    str,
    option(
        "--color",
        parse=values.Choice(COLOR_CHOICES),
        help="Colour: auto (on a terminal, unless NO_COLOR is set), always or never.",
    ),
]


# --- reading -f ---------------------------------------------------------------------------


class Source:
    """One input of ``-f``: a name for messages (``<stdin>`` or the path) and its text."""

    __slots__ = ("name", "text")

    def __init__(self, name: str, text: str) -> None:
        self.name, self.text = name, text


def read_sources(filenames: Iterable[str], *, recursive: bool = False) -> list[Source]:
    """Every input ``-f`` names, in order: ``-`` is stdin (once), a directory is its
    .yaml/.yml/.json files in name order (subdirectories with ``recursive``). Each is read whole,
    within the input limits (``meshctl.inputs``)."""
    limits = inputs.limits()
    sources: list[Source] = []
    for name in source_names(filenames, recursive=recursive):
        if name == "-":
            text = decode(inputs.read_stdin(limits), inputs.STDIN_NAME)
            sources.append(Source(inputs.STDIN_NAME, text))
        else:
            sources.append(Source(name, _read(Path(name).expanduser(), name, limits)))
    return sources


def source_names(filenames: Iterable[str], *, recursive: bool = False) -> list[str]:
    """The inputs ``-f`` names, directories expanded to their files (``read_sources``' order),
    for a command that reads them one at a time."""
    names: list[str] = []
    stdin_read = False
    for name in filenames:
        if name == "-":
            if stdin_read:
                raise UserError("-f - given twice", hint="stdin can be read only once")
            stdin_read = True
            names.append(name)
            continue
        path = Path(name).expanduser()
        if path.is_dir():
            files = sorted(
                p
                for p in (path.rglob("*") if recursive else path.iterdir())
                if p.suffix in MANIFEST_SUFFIXES and p.is_file()
            )
            if not files:
                raise UserError(
                    f"{name}: no {'/'.join(MANIFEST_SUFFIXES)} files in this directory",
                    hint="name the files with -f, or add -R for subdirectories",
                )
            names.extend(str(p) for p in files)
        else:
            names.append(name)
    return names


def cannot_read(name: str, exc: OSError) -> MeshctlError:
    """The error for an input ``-f`` names that cannot be opened or read: a usage error (2),
    like a bad flag (docs/cli.md's exit codes)."""
    return UserError(
        f"cannot read {name}: {exc.strerror or exc}",
        hint="check the path given with -f (use -f - to read stdin)",
    )


def values_sources(filenames: Iterable[str]) -> list[tuple[str, Any]]:
    """Install values given with ``-f`` (files, directories, ``-``): each as (name, document)."""
    from meshctl import config

    return config.values_files([(s.name, s.text) for s in read_sources(filenames)])


def _read(path: Path, name: str, limits: Limits) -> str:
    try:
        return inputs.read_text(path, name, limits)
    except OSError as exc:
        raise cannot_read(name, exc) from exc


# --- writing -O ----------------------------------------------------------------------------


def write_output(text: str, output: Path | None) -> None:
    """``text`` to stdout, or atomically to ``output`` (``-O``: a reader never sees half a
    file, and on an error before this nothing is written at all)."""
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    import tempfile  # deferred: only -O pays for it (every plugin's --help loads this module)

    target = output.expanduser()
    try:
        fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise MeshctlError(
            f"cannot write {output}: {exc.strerror or exc}",
            hint="check that the directory exists and is writable",
        ) from exc
    staged = Path(temp)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        # mkstemp makes the file 0600; keep the mode of the file replaced, else 0644 less umask.
        try:
            mode = target.stat().st_mode & 0o777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        staged.chmod(mode)
        staged.replace(target)
    except OSError as exc:
        staged.unlink(missing_ok=True)
        raise MeshctlError(
            f"cannot write {output}: {exc.strerror or exc}", hint="check the path and free space"
        ) from exc


# --- daemons ------------------------------------------------------------------------------


def daemon_logging(ctx: typer.Context) -> str:
    """A long-running command's logging: at ``info`` unless the user chose a level, so the
    "listening" and "ready" lines show at the default level. Returns the level in effect."""
    settings: GlobalSettings = ctx.obj
    level = "debug" if settings.debug else (settings.log_level or logs.DAEMON_LEVEL)
    logs.configure(level, settings.log_format)
    return level


# --- the tree of a plugin, once loaded ----------------------------------------------------


def prepare_tree(command: click.Command) -> None:
    """What the root does to every plugin's command tree when it loads it: group options
    handed down or refused (``hold_group_options``), duration defaults shown as durations."""
    hold_group_options(command)
    show_durations(command)


def show_durations(command: click.Command) -> None:
    """A duration option's default is shown as a duration (``[default: 24h]``, not
    ``86400.0``): the default becomes its text, which click runs through the option's parser
    like any typed value, so the command still receives seconds."""
    for param in command.params:
        parse = getattr(getattr(param.type, "func", None), "meshctl_parse", None)
        default = param.default
        if (
            isinstance(parse, values.Duration)
            and isinstance(default, int | float)
            and not isinstance(default, bool)
        ):
            param.default = values.format_duration(float(default))
    for child in getattr(command, "commands", {}).values():
        show_durations(child)


# --- options given on a group -------------------------------------------------------------


def hold_group_options(command: click.Command, path: str = "") -> None:
    """Make every group in ``command``'s tree hand its own options down or refuse them.

    An option given on a group before a subcommand (``meshctl inject --revision canary
    webhook-config``) becomes that subcommand's value for its option of the same name (given
    on both with different values, it is a usage error); a subcommand without such an option
    makes it a usage error (exit 2). So a group's option is never silently ignored.
    """
    name = f"{path} {command.name}".strip()
    if not isinstance(command, TyperGroup):
        return
    own = [p for p in command.params if p.expose_value and p.name]
    if own:
        command.callback = _handing_down(command.callback, own, name)
        for child in command.commands.values():
            child.callback = _checking_handed_down(child.callback)
    for child in command.commands.values():
        hold_group_options(child, name)


def _handing_down(
    original: Callable[..., Any] | None, own: list[click.Parameter], group: str
) -> Callable[..., Any]:
    def callback(*args: Any, **kwargs: Any) -> Any:
        ctx = get_current_context()
        if ctx.invoked_subcommand is not None:
            _hand_down(ctx, own, ctx.invoked_subcommand, group)
        return original(*args, **kwargs) if original is not None else None

    return functools.wraps(original)(callback) if original is not None else callback


def _checking_handed_down(original: Callable[..., Any] | None) -> Callable[..., Any]:
    def callback(*args: Any, **kwargs: Any) -> Any:
        _check_handed_down(get_current_context())
        return original(*args, **kwargs) if original is not None else None

    return functools.wraps(original)(callback) if original is not None else callback


def _hand_down(ctx: click.Context, own: list[click.Parameter], sub: str, group: str) -> None:
    target = ctx.command.get_command(ctx, sub)  # type: ignore[attr-defined]
    if target is None:
        return
    by_name = {p.name: p for p in target.params}
    given = [
        p
        for p in own
        if p.name is not None and ctx.get_parameter_source(p.name) is ParameterSource.COMMANDLINE
    ]
    defaults: dict[str, object] = {}
    for param in given:
        flag = _flag(param)
        if param.name not in by_name:
            raise UsageError(
                f"{flag} is an option of 'meshctl {group}'; 'meshctl {group} {sub}' "
                f"does not take it",
                ctx,
            )
        defaults[str(param.name)] = ctx.params[str(param.name)]
    if defaults:
        ctx.default_map = {**(ctx.default_map or {}), sub: defaults}
        ctx.meta[_handed_down_key(sub)] = defaults


def _handed_down_key(sub: str) -> str:
    return f"meshctl.group_options.{sub}"


def _check_handed_down(ctx: click.Context) -> None:
    """Refuse a subcommand flag that contradicts the same option given on its group."""
    parent = ctx.parent
    if parent is None or ctx.info_name is None:
        return
    handed: Mapping[str, object] = parent.meta.get(_handed_down_key(ctx.info_name), {})
    for name, value in handed.items():
        source = ctx.get_parameter_source(name)
        if source is ParameterSource.COMMANDLINE and ctx.params.get(name) != value:
            param = next(p for p in ctx.command.params if p.name == name)
            raise UsageError(
                f"{_flag(param)} was given on '{parent.command_path}' and on "
                f"'{ctx.command_path}' with different values",
                ctx,
            )


def _flag(param: click.Parameter) -> str:
    opts = [o for o in getattr(param, "opts", []) if o.startswith("--")]
    return opts[0] if opts else "/".join(getattr(param, "opts", [])) or str(param.name)


# --- the cluster ------------------------------------------------------------------------------


def kube_settings(ctx: typer.Context) -> KubeSettings:
    """Where the cluster is, from the root's --kubeconfig, --context and --request-timeout."""
    from meshctl.kube.client import KubeSettings  # deferred: only cluster commands need it

    settings: GlobalSettings = ctx.find_root().obj
    return KubeSettings(
        kubeconfig=settings.kubeconfig,
        context=settings.context,
        request_timeout=settings.request_timeout,
    )
