"""The root command: global options, lazy plugin subcommands, and error rendering.

Invariants:
- ``meshctl --help`` lists plugins from their manifests and imports none of them.
- A subcommand's plugin is imported only when that subcommand runs (or its own ``--help``).
- Expected failures print ``Error: ...`` and ``Hint: ...`` on stderr and exit 1/2/3; tracebacks
  only with ``--debug``. Global options work before or after the subcommand, like kubectl's.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer
import typer.core

# Typer >= 0.28 vendors click as ``typer._click``; the Typer group and its exceptions come from
# there (the separate ``click`` distribution is not the same classes). Pinned to a minor range.
from typer import _click as click

from meshctl import __version__, config, logs, values
from meshctl.errors import EXIT_RUNTIME, EXIT_USAGE, MeshctlError, format_error
from meshctl.plugins import PluginInfo, discover, load

log = logging.getLogger(__name__)

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}

# Global flags that may appear anywhere before "--"; value-taking ones consume the next word.
_GLOBAL_FLAGS = {
    "--debug": False,
    "--log-level": True,
    "--log-format": True,
    "--kubeconfig": True,
    "--context": True,
    "--config": True,
    "--request-timeout": True,
}

# Where the shell's completion script (``meshctl completion SHELL``) asks for candidates.
COMPLETE_VAR = "_MESHCTL_COMPLETE"


class PluginGroup(typer.core.TyperGroup):
    """A group whose subcommands are entry-point plugins, imported on first use."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._plugins: dict[str, PluginInfo] | None = None
        self._loaded: dict[str, click.Command] = {}

    @property
    def plugins(self) -> dict[str, PluginInfo]:
        if self._plugins is None:
            self._plugins = discover()
        return self._plugins

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, p in self.plugins.items() if not p.hidden)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self._loaded:
            return self._loaded[cmd_name]
        info = self.plugins.get(cmd_name)
        if info is None:
            return None
        from meshctl import options  # deferred: the root's own --help does not need it

        command = _as_click_command(load(info), info)
        options.prepare_tree(command)
        self._loaded[cmd_name] = command
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and name not in self.plugins:
            known = self.list_commands(ctx)
            import difflib  # only for a mistyped command: --help does not pay for it

            close = difflib.get_close_matches(name, known, n=1)
            guess = f"; did you mean {close[0]!r}?" if close else ""
            listing = ", ".join(known) or "none installed"
            raise click.exceptions.UsageError(
                f"unknown command {name!r} (commands: {listing}){guess}", ctx
            )
        return super().resolve_command(ctx, args)

    # Help rows come from manifests; the inherited version would import every plugin.
    # (rich_markup_mode=None on the app keeps the root help plain, so rich is not imported.)
    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, self.plugins[name].help) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _as_click_command(obj: object, info: PluginInfo) -> click.Command:
    if inspect.isfunction(obj):
        command = _raw_command(obj, info)
    elif isinstance(obj, typer.Typer):
        command = typer.main.get_command(obj)
    elif isinstance(obj, click.Command):
        command = obj
    else:
        raise MeshctlError(
            f"plugin {info.name!r} ({info.target}) is a {type(obj).__name__}, not a typer.Typer",
            hint=f"report this to the maintainers of {info.distribution}",
        )
    command.name = info.name
    if not command.help and info.help:
        command.help = info.help
    return command


def _raw_command(function: Callable[[list[str]], int], info: PluginInfo) -> click.Command:
    """A raw plugin reached after global flags: hand it every remaining argument untouched."""
    wrapper = typer.Typer(add_completion=False, rich_markup_mode=None)

    @wrapper.command(
        name=info.name,
        help=info.help,
        add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
    def invoke(ctx: typer.Context) -> None:
        code = function(list(ctx.args))
        if code:
            raise typer.Exit(code)

    return typer.main.get_command(wrapper)


app = typer.Typer(
    cls=PluginGroup,
    name="meshctl",
    help="meshctl: a service mesh in one binary (Istio's ports and conventions).",
    context_settings=CONTEXT_SETTINGS,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"meshctl {__version__}")
        raise typer.Exit(0)


def _request_timeout(raw: Any) -> Any:
    """--request-timeout's parser: ``options.typed`` over a duration, imported only when the
    flag is given (``meshctl --help`` stays off the shared options module)."""
    from meshctl import options

    return options.typed(_request_timeout.meshctl_parse)(raw)  # type: ignore[attr-defined]


_request_timeout.meshctl_parse = values.Duration()  # type: ignore[attr-defined]  # the tree test


def _choice(choices: tuple[str, ...]) -> Callable[[Any], Any]:
    """A parser for one of ``choices``, built like ``_request_timeout``'s: the shared options
    module is imported only when the flag is given."""
    parse = values.Choice(choices)

    def parser(raw: Any) -> Any:
        from meshctl import options

        return options.typed(parse)(raw)

    parser.meshctl_parse = parse  # type: ignore[attr-defined]  # the tree test reads it
    return parser


@app.callback()
def root(
    ctx: typer.Context,
    debug: Annotated[
        bool | None,
        typer.Option("--debug", help="Show tracebacks and debug logs [env MESHCTL_DEBUG]"),
    ] = None,
    log_level: Annotated[
        str | None,
        typer.Option(
            "--log-level",
            metavar="|".join(config.LOG_LEVELS),
            parser=_choice(config.LOG_LEVELS),
            help="Log level (default: warning; info for daemons) [env MESHCTL_LOG_LEVEL]",
            show_default=False,
        ),
    ] = None,
    log_format: Annotated[
        str | None,
        typer.Option(
            "--log-format",
            metavar="|".join(config.LOG_FORMATS),
            parser=_choice(config.LOG_FORMATS),
            help="Log line format (default: text) [env MESHCTL_LOG_FORMAT]",
            show_default=False,
        ),
    ] = None,
    kubeconfig: Annotated[
        str | None,
        typer.Option("--kubeconfig", metavar="PATH", help="Kubeconfig file [env KUBECONFIG]"),
    ] = None,
    context: Annotated[
        str | None,
        typer.Option(
            "--context", metavar="NAME", help="Kubeconfig context to use [env MESHCTL_CONTEXT]"
        ),
    ] = None,
    request_timeout: Annotated[
        float | None,
        typer.Option(
            "--request-timeout",
            metavar="DURATION",
            parser=_request_timeout,
            help="Give up on one API server request after this long (default 30s; 0: never) "
            "[env MESHCTL_REQUEST_TIMEOUT]",
            show_default=False,
        ),
    ] = None,
    config_file: Annotated[
        str | None,
        typer.Option(
            "--config",
            metavar="PATH",
            help="Settings file (default ~/.config/meshctl/config.yaml) [env MESHCTL_CONFIG]",
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """meshctl: a service mesh in one binary (Istio's ports and conventions)."""
    flags = {
        "debug": debug,
        "log_level": log_level,
        "log_format": log_format,
        "kubeconfig": kubeconfig,
        "context": context,
        "config_file": config_file,
        "request_timeout": request_timeout,
    }
    data, file_name = config.load_file(config_file)
    settings = config.resolve(
        config.GlobalSettings, flags=flags, file=_globals_of(data), file_name=file_name
    )
    level = "debug" if settings.debug else (settings.log_level or logs.DEFAULT_LEVEL)
    logs.configure(level, settings.log_format)
    # Subcommands read shared settings from ctx.obj and their own section from ctx.meta.
    ctx.obj = settings
    ctx.meta[config.SETTINGS_FILE_META] = (data, file_name)


def _globals_of(data: dict[str, Any]) -> dict[str, Any]:
    """Top-level scalar keys are global settings; mappings are subcommand sections."""
    return {k: v for k, v in data.items() if not isinstance(v, dict)}


def hoist_global_flags(argv: Sequence[str]) -> list[str]:
    """Move global flags found after the subcommand to the front, as cobra's persistent flags."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            rest.extend(argv[i:])
            break
        name = word.split("=", 1)[0]
        if name in _GLOBAL_FLAGS:
            front.append(word)
            if _GLOBAL_FLAGS[name] and "=" not in word and i + 1 < len(argv):
                front.append(argv[i + 1])
                i += 1
        else:
            rest.append(word)
        i += 1
    return front + rest


def main(argv: Sequence[str] | None = None) -> int:  # noqa: PLR0911 (one exit per error kind)
    """Run meshctl with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    args = hoist_global_flags(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or _debug_env(os.environ.get("MESHCTL_DEBUG") or "false")
    command = typer.main.get_command(app)
    _answer_completion_requests()
    try:
        # Without standalone mode click returns typer.Exit's code instead of raising it.
        result = command.main(
            args=args, prog_name="meshctl", complete_var=COMPLETE_VAR, standalone_mode=False
        )
    except MeshctlError as exc:
        if debug:
            log.exception("failed")
        return _report(exc.message, exc.hint, exc.exit_code)
    except typer.Exit as exc:
        return int(exc.exit_code)
    except click.exceptions.NoArgsIsHelpError as exc:
        # A bare group prints its help and succeeds, as kubectl and istioctl do.
        if exc.ctx is not None:
            print(exc.ctx.get_help())
        return 0
    except click.exceptions.UsageError as exc:
        hint = "run 'meshctl --help' for usage"
        if exc.ctx is not None and exc.ctx.command_path != "meshctl":
            hint = f"run '{exc.ctx.command_path} --help' for usage"
        # typer validates through pydantic, which prefixes a validator's reason with
        # "Value error, "; the reason alone reads as every other meshctl message does.
        return _report(exc.format_message().replace("Value error, ", ""), hint, EXIT_USAGE)
    except click.exceptions.ClickException as exc:
        return _report(exc.format_message(), None, exc.exit_code)
    except typer.Abort:
        return _report("aborted", None, 130)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # last resort: never show a traceback without --debug
        if debug:
            raise
        return _report(
            f"internal error: {type(exc).__name__}: {exc}",
            "rerun with --debug and report the traceback",
            EXIT_RUNTIME,
        )
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


def _debug_env(raw: str) -> bool:
    """``MESHCTL_DEBUG`` read early, for tracebacks; a value that is not a boolean counts as
    false here, and the settings resolution refuses it with a usage error (exit 2)."""
    try:
        return config._to_bool(raw)
    except ValueError:
        return False


def _answer_completion_requests() -> None:
    """When asked for a shell's script (``_MESHCTL_COMPLETE=source_<shell>``), typer's shell
    classes print it; registering them costs an import, so only those requests pay it. A
    <TAB>'s ``complete_<shell>`` is ``meshctl.completion``'s."""
    if os.environ.get(COMPLETE_VAR):
        from typer._completion_classes import completion_init

        completion_init()


def _report(message: str, hint: str | None, code: int) -> int:
    sys.stderr.write(format_error(message, hint))
    return code


__all__ = ["__version__", "app", "main"]
