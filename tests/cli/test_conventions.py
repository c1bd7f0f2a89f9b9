"""Every command in the tree holds to docs/cli.md: walked from the plugin registry, so a plugin
installed tomorrow (in tree or from another distribution) is checked by the same rules."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer import _click as click
from typer.core import TyperArgument, TyperGroup, TyperOption
from typer.models import TyperPath

from meshctl import cli, values
from meshctl.config import GlobalSettings
from meshctl.plugins import load
from tests.harness.gateway import MINIMAL

# --- the tree ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Node:
    path: tuple[str, ...]  # words after "meshctl"
    command: click.Command
    ctx: click.Context

    @property
    def id(self) -> str:
        return " ".join(self.path) or "(root)"

    @property
    def options(self) -> list[TyperOption]:
        return [
            p
            for p in self.command.params
            if isinstance(p, TyperOption) and p.expose_value and not p.hidden
        ]


def _walk() -> Iterator[Node]:
    root = typer.main.get_command(cli.app)
    root_ctx = click.Context(root, info_name="meshctl")
    yield Node((), root, root_ctx)
    for name, info in sorted(root.plugins.items()):  # hidden plugins too
        if inspect.isfunction(load(info)):
            continue  # a raw plugin (argparse, no typer): the data plane and the CNI plugin
        yield from _below(root.get_command(root_ctx, name), (name,), root_ctx)


def _below(command: click.Command, path: tuple[str, ...], parent: click.Context) -> Iterator[Node]:
    ctx = click.Context(command, info_name=path[-1], parent=parent)
    yield Node(path, command, ctx)
    if isinstance(command, TyperGroup):
        for name in sorted(command.commands):
            yield from _below(command.commands[name], (*path, name), ctx)


TREE = list(_walk())
COMMANDS = [n for n in TREE if n.path]
GROUPS = [n for n in TREE if isinstance(n.command, TyperGroup) and n.path]


def by_id(nodes: list[Node]) -> Any:
    return pytest.mark.parametrize("node", nodes, ids=[n.id for n in nodes])


# What an option parses with, read from the click parameter typer built: a ``parser=`` is a
# FuncParamType around our function, an Enum a Choice, a bare int/float/Path click's own type.
def _parse(param: click.Parameter) -> Any:
    """The meshctl.values parser behind an option (``meshctl.options.typed``), or None."""
    return getattr(getattr(param.type, "func", None), "meshctl_parse", None)


def _choices(param: click.Parameter) -> list[str]:
    return [str(getattr(c, "value", c)) for c in getattr(param.type, "choices", None) or ()]


UNCHECKED_TYPES = (click.types.IntParamType, click.types.FloatParamType, TyperPath)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_walk_reaches_every_plugin():
    found = {n.path[0] for n in COMMANDS}
    assert {
        "version",
        "iptables",
        "inject",
        "ztunnel",
        "cni",
        "completion",
        "controlplane",
    } <= found
    assert ("inject", "webhook-config") in {n.path for n in COMMANDS}


# --- help -----------------------------------------------------------------------------------


@by_id(TREE)
def test_help_runs_and_says_what_the_command_does(node, capsys):
    for flag in ("--help", "-h"):
        code, out, err = run(capsys, *node.path, flag)
        assert code == 0, err
        assert out.startswith(f"Usage: {' '.join(('meshctl', *node.path))}"), out[:200]
    assert (node.command.help or "").strip(), f"meshctl {node.id} has no help text"


# A type name (PORT, DURATION, NS/NAME/SA, HOST:PORT, KEY=VALUE, FILE|DIR|-) or the choices (a|b|c).
TYPE_METAVAR = re.compile(r"^[A-Z][A-Z0-9_]*(?:[/:|.,=][A-Z0-9_]+|\|-)*$")
CHOICE_METAVAR = re.compile(r"^[A-Za-z0-9_.-]+(?:\|[A-Za-z0-9_.-]+)+$")
GENERIC = {"TEXT", "STR", "STRING", "INTEGER", "INT", "FLOAT", "BOOLEAN", "BOOL", "VALUE"}


def _metavar(param: click.Parameter, ctx: click.Context) -> str:
    record = param.get_help_record(ctx)
    assert record is not None
    words = record[0].split()
    return words[-1] if isinstance(param, TyperOption) else " ".join(words)


@by_id(TREE)
def test_every_option_has_help_and_a_metavar_naming_its_type(node):
    for param in node.command.params:
        if getattr(param, "hidden", False) or not param.expose_value:
            continue
        where = f"meshctl {node.id} {param.opts[0] if param.opts else param.name}"
        if isinstance(param, TyperOption):
            assert (param.help or "").strip(), f"{where}: no help"
            if param.is_flag:
                continue
        shown = _metavar(param, node.ctx)
        metavar, *types = shown.split()
        for word in types:  # an argument's type, as typer shows it: choices only, not <str>
            if isinstance(param, TyperArgument) and param.nargs == -1 and word == "<list[str]>":
                continue  # free words (a command to run): typer always shows this after the name
            assert CHOICE_METAVAR.match(word.strip("<>")), f"{where}: placeholder {shown!r}"
        assert metavar not in GENERIC, f"{where}: {metavar!r} names no type"
        assert TYPE_METAVAR.match(metavar) or CHOICE_METAVAR.match(metavar), (
            f"{where}: metavar {metavar!r} is neither a type name nor a|b|c choices"
        )


# --- one spelling per meaning -------------------------------------------------------------

FORMATS = ("json", "yaml", "table", "name")  # docs/cli.md; meshctl.output.FORMATS says the same

# The one place a short flag keeps another meaning: istio-iptables' own flags on `iptables`.
ISTIO_SHORT_FLAGS = {"-o": "--istio-local-outbound-ports-exclude"}
SHORT_MEANINGS = {"-o": "--output", "-O": "--output-file", "-n": "--namespace", "-f": "--filename"}


def _long(param: TyperOption) -> str:
    return next(o for o in param.opts if o.startswith("--"))


@by_id(TREE)
def test_short_flags_mean_the_same_everywhere(node):
    for param in node.options:
        for short, meaning in SHORT_MEANINGS.items():
            if short in param.opts:
                allowed = {meaning} | (
                    {ISTIO_SHORT_FLAGS[short]}
                    if node.path[:1] == ("iptables",) and short in ISTIO_SHORT_FLAGS
                    else set()
                )
                assert _long(param) in allowed, f"meshctl {node.id}: {short} is {_long(param)}"


@by_id(TREE)
def test_output_is_the_shared_format_option_and_files_are_output_file(node):
    for param in node.options:
        long = _long(param)
        if long == "--output":
            choices = set(_choices(param))
            assert choices == set(FORMATS), f"meshctl {node.id} -o: {sorted(choices)}"
            if "-o" not in param.opts:
                assert "-o is" in (param.help or ""), f"meshctl {node.id}: say why not -o"
        elif long == "--output-file":
            assert "-O" in param.opts
        else:
            assert "output" not in long, f"meshctl {node.id}: {long}: use -o or -O/--output-file"


@by_id(TREE)
def test_filename_takes_dash_files_and_directories(node):
    for param in node.options:
        if "-f" in param.opts or _long(param) == "--filename":
            assert param.multiple, f"meshctl {node.id} -f is not repeatable"
            assert _metavar(param, node.ctx) == "FILE|DIR|-"


@by_id(TREE)
def test_dry_run_is_a_flag_or_kubectls_modes(node):
    for param in node.options:
        if _long(param) == "--dry-run":
            parse = _parse(param)
            assert param.is_flag or (
                isinstance(parse, values.Choice)
                and set(parse.choices) <= {"none", "client", "server"}
            ), f"meshctl {node.id} --dry-run"


# --- values ---------------------------------------------------------------------------------


@by_id(TREE)
def test_numbers_durations_and_paths_are_parsed_with_a_range(node):
    """An int/float/Path option parsed by typer alone accepts -1 (or any path) silently."""
    for param in [*node.options, *(p for p in node.command.params if isinstance(p, TyperArgument))]:
        # click's own int/float/Path types: typer parsed it alone (with a parser= it is a
        # FuncParamType around a meshctl.values parser instead).
        assert not isinstance(param.type, UNCHECKED_TYPES), (
            f"meshctl {node.id} {param.opts[0] if param.opts else param.name}: "
            f"{param.type.name} without a meshctl.values/options parser"
        )


# Options whose flag is also a settings field's but which deliberately do not set it.
NOT_THAT_SETTING = {
    ("cni", "manifest", "--cni-bin-dir"): "the host path the DaemonSet mounts",
    ("cni", "manifest", "--cni-conf-dir"): "the host path the DaemonSet mounts",
    ("ztunnel", "certs", "--trust-domain"): "what to mint for, not the running proxy's",
    ("ztunnel", "certs", "--workload"): "whose certificate to mint, not the running proxy's",
    ("ztunnel", "certs", "--ca-dir"): "where to mint the CA, not the node proxy's CA",
    ("ztunnel", "manifest", "--ca-address"): "what the DaemonSet is given, not this process",
    ("ztunnel", "manifest", "--xds-address"): "what the DaemonSet is given, not this process",
    ("ztunnel", "manifest", "--workers"): "what the DaemonSet is given, not this process",
    ("cni", "manifest", "--ambient"): "what the DaemonSet runs, not this process",
    ("cni", "manifest", "--netns-dir"): "the host path the DaemonSet mounts",
    ("controlplane", "manifest", "--namespace"): "where the manifest installs",
    ("controlplane", "manifest", "--revision"): "what the Deployment is given",
}


def _settings_classes(node: Node) -> list[type]:
    if not node.path:
        return [GlobalSettings]
    callback = node.command.callback
    if callback is None:
        return []
    module = sys.modules[inspect.unwrap(callback).__module__]
    return [
        v
        for v in vars(module).values()
        if isinstance(v, type)
        and dataclasses.is_dataclass(v)
        and any(f.metadata.get("env") for f in dataclasses.fields(v))
    ]


@by_id(TREE)
def test_every_option_an_env_var_sets_shows_it(node):
    env_of: dict[str, tuple[str, ...]] = {}
    for cls in _settings_classes(node):
        for field in dataclasses.fields(cls):
            env = field.metadata.get("env")
            if not env:
                continue
            flags = (field.metadata.get("flag") or "--" + field.name.replace("_", "-")).split("/")
            for flag in flags:
                env_of[flag] = (env,) if isinstance(env, str) else tuple(env)
    for param in node.options:
        if (*node.path, _long(param)) in NOT_THAT_SETTING:
            continue
        for flag in param.opts:
            if flag in env_of:
                expected = f"[env {', '.join(env_of[flag])}]"
                assert expected in (param.help or ""), f"meshctl {node.id} {flag}: {expected}"


# --- groups ---------------------------------------------------------------------------------


def _sample(param: TyperOption, tmp_path: Path) -> list[str]:
    """The option with a value its parser accepts, so only the group rule can refuse it."""
    if param.is_flag:
        return [param.opts[0]]
    parse = _parse(param)
    if _choices(param):
        value = _choices(param)[0]
    elif isinstance(parse, values.Choice):
        value = parse.choices[0]
    elif isinstance(parse, values.Integer):
        value = str(max(parse.minimum or 0, 1))
    elif isinstance(parse, values.Duration):
        value = "1s"
    elif isinstance(parse, values.Address):
        value = "127.0.0.1"
    elif parse is not None and type(parse).__name__ == "ExistingFile":
        value = __file__
    else:
        value = str(tmp_path / "x")
    return [param.opts[0], value]


@by_id(GROUPS)
def test_a_groups_option_reaches_the_subcommand_or_is_refused(node, capsys, tmp_path):
    own = node.options
    for sub_name, sub in node.command.commands.items():
        taken = {p.name for p in sub.params}
        for param in own:
            code, _, err = run(capsys, *node.path, *_sample(param, tmp_path), sub_name, "--help")
            if param.name in taken:
                assert code == 0, f"meshctl {node.id} {param.opts[0]} {sub_name}: {err}"
            else:
                assert code == 2, f"meshctl {node.id} {param.opts[0]} {sub_name} was accepted"
                assert "does not take it" in err, err


# --- errors and the root ----------------------------------------------------------------------


@by_id(COMMANDS)
def test_an_unknown_option_is_one_usage_error(node, capsys):
    code, out, err = run(capsys, *node.path, "--no-such-option")
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 2, err
    assert lines[0].startswith("Error: "), err
    assert lines[1].startswith("Hint: "), err


def test_root_has_version_and_completion_for_four_shells(capsys):
    code, out, _ = run(capsys, "--version")
    assert (code, out) == (0, f"meshctl {cli.__version__}\n")
    for shell in ("bash", "zsh", "fish", "powershell"):
        code, out, err = run(capsys, "completion", shell)
        assert code == 0, err
        assert "_MESHCTL_COMPLETE=complete_" in out or "_MESHCTL_COMPLETE" in out


def test_help_of_every_command_imports_neither_rich_nor_a_kubernetes_client():
    """rich (progress bars) and kubernetes are start-up costs only the work itself may pay."""
    paths = [list(n.path) for n in TREE]
    code = textwrap.dedent(f"""
        import contextlib, io, json, sys
        from meshctl.cli import main
        for path in {paths!r}:
            with contextlib.redirect_stdout(io.StringIO()):
                assert main([*path, "--help"]) == 0, path
        print(json.dumps([m for m in ("rich", "kubernetes", "hypercorn") if m in sys.modules]))
    """)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


# --- HOST:PORT ------------------------------------------------------------------------------


def _required_samples(node: Node, tmp_path: Path, skip: TyperOption) -> list[str]:
    """Values for the command's other required options, so only the one tested can fail."""
    words: list[str] = []
    for param in node.options:
        if param.required and param is not skip:
            words += _sample(param, tmp_path)
    return words


HOST_PORT_OPTIONS = [
    (n, p) for n in COMMANDS for p in n.options if _metavar(p, n.ctx) in ("HOST:PORT", "IP:PORT")
]


def test_the_host_port_options_are_the_ones_the_docs_name():
    found = {(n.id, _long(p)) for n, p in HOST_PORT_OPTIONS}
    assert {
        ("ztunnel run", "--ca-address"),
        ("ztunnel run", "--xds-address"),
        ("ztunnel manifest", "--ca-address"),
        ("controlplane run", "--grpc-address"),
        ("controlplane ca", "--grpc-address"),
        ("cni install", "--readiness-address"),
        ("iptables trace", "--dst"),
    } <= found


@pytest.mark.parametrize(
    ("node", "param"), HOST_PORT_OPTIONS, ids=[f"{n.id} {_long(p)}" for n, p in HOST_PORT_OPTIONS]
)
def test_every_host_port_is_checked_while_parsing_with_its_range(node, param, capsys, tmp_path):
    parse = _parse(param)
    assert isinstance(parse, values.ListenAddress | values.DialAddress | values.Endpoint), (
        f"meshctl {node.id} {_long(param)}: HOST:PORT without values.ListenAddress/DialAddress"
    )
    for bad, reason in (("127.0.0.1:70000", "port 70000 is out of range"), ("nonsense", "")):
        args = [*node.path, *_required_samples(node, tmp_path, param), _long(param), bad]
        code, _, err = run(capsys, *args)
        assert code == 2, f"meshctl {' '.join(args)}: {err}"
        assert f"Invalid value for '{_long(param)}'" in err, err
        assert reason in err, err
        assert "65535" in err, err  # the allowed range is in the message


# --- choices and durations in help ------------------------------------------------------------


@by_id(TREE)
def test_an_option_with_fixed_choices_shows_them_as_its_metavar(node):
    for param in node.options:
        parse = _parse(param)
        choices = parse.choices if isinstance(parse, values.Choice) else tuple(_choices(param))
        if not choices or param.is_flag:
            continue
        assert _metavar(param, node.ctx) == "|".join(choices), (
            f"meshctl {node.id} {_long(param)}: metavar {_metavar(param, node.ctx)!r}"
        )


def test_the_root_profile_and_mode_options_show_their_choices():
    shown = {(n.id, _long(p)): _metavar(p, n.ctx) for n in TREE for p in n.options}
    assert shown[("(root)", "--log-level")] == "debug|info|warning|error"
    assert shown[("(root)", "--log-format")] == "text|json"
    assert shown[("demo", "--mode")] == "ambient|sidecar"
    for where in (("install", "--profile"), ("verify", "--profile")):
        assert shown[where] == "default|ambient|minimal|demo|ambient-istiod"


@by_id(TREE)
def test_a_duration_default_is_shown_as_a_duration(node):
    for param in node.options:
        if not isinstance(_parse(param), values.Duration) or param.hidden:
            continue
        record = param.get_help_record(node.ctx)
        assert record is not None
        shown = re.search(r"\[default: ([^\]]+)\]", record[1])
        if shown:
            assert re.fullmatch(r"(\d+[dhms]|\d+ms)+", shown.group(1)), (
                f"meshctl {node.id} {_long(param)}: default shown as {shown.group(1)!r}"
            )


def test_durations_that_were_seconds_take_durations_and_the_old_spelling_still_works(
    capsys, tmp_path
):
    _, out, _ = run(capsys, "inject", "webhook", "--help")
    assert "--drain-deadline DURATION" in out
    assert "[default: 5s]" in out
    assert "--drain-seconds" not in out  # the old name works but is not advertised
    _, out, _ = run(capsys, "inject", "webhook-config", "--help")
    assert "--timeout DURATION" in out
    assert "[default: 10s]" in out
    bundle = str(tmp_path / "ca.crt")
    Path(bundle).write_text("-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n")
    for given, seconds in (("7", 7), ("15s", 15)):
        code, out, err = run(
            capsys, "inject", "webhook-config", "--ca-bundle", bundle, "--url",
            "https://h:15017/inject", "--timeout", given, "-o", "json",
        )  # fmt: skip
        assert code == 0, err
        assert json.loads(out)["webhooks"][0]["timeoutSeconds"] == seconds
    for given, reason in (("31s", "(1s to 30s)"), ("1.5s", "not a whole number of seconds")):
        code, _, err = run(
            capsys, "inject", "webhook-config", "--ca-bundle", bundle, "--url", "https://h/x",
            "--timeout", given,
        )  # fmt: skip
        assert code == 2, err
        assert reason in err


# --- -O/--output-file -------------------------------------------------------------------------

# Each data command with arguments that make it print its data without a cluster or a kernel.
DATA_COMMANDS: dict[str, list[str]] = {
    "version": [],
    "completion": ["bash"],
    "inject": ["-f", "{manifest}"],
    "inject webhook-config": ["--ca-bundle", "{pem}", "--url", "https://h:15017/inject"],
    "ztunnel manifest": [],
    "cni manifest": [],
    "controlplane manifest": [],
    "install": ["--dry-run"],
    "manifest generate": [],
    "manifest profiles": [],
    "iptables render": [],
    "iptables trace": ["--dst", "10.0.0.1:80"],
    "verify": ["--kubeconfig", "{missing}"],  # no cluster: the failed check is the data
    "gateway routes": ["-f", "{gateway}"],
    "gateway explain": ["http://example.com/", "-f", "{gateway}"],
    "image build": ["--tree", "{tree}", "--archive", "{tree}.tar"],  # a tiny tree, Debian base
    "image push": ["127.0.0.1:1/m:1", "--from", "{archive}", "--dry-run"],
    "analyze": ["--use-kube=false", "-f", "{manifest}"],
}
# Data commands whose data needs a cluster that answers: where their -O is proven instead.
CLUSTER_DATA_COMMANDS = {
    "stat": "tests/kube/test_stat_kube.py",
    "top": "tests/kube/test_stat_kube.py",
    "proxy-status": "tests/node/test_proxy_status_on_node.py",
    "proxy-config": "tests/node/test_proxy_status_on_node.py",
    "tag set": "tests/kube/test_revision_tags.py",
    "tag list": "tests/kube/test_revision_tags.py",
    "tag remove": "tests/kube/test_revision_tags.py",
    "upgrade": "tests/kube/test_upgrade_plan.py",
}


# Commands whose -O names the file they exist to write (not a copy of stdout): -o prints a
# summary of it to stdout. Their own tests check the file is written atomically.
ARCHIVE_COMMANDS = {"bug-report": "the report archive; -o prints its summary"}


def test_every_command_that_prints_data_takes_output_file():
    takes_o = {n.id for n in COMMANDS if any(_long(p) == "--output" for p in n.options)}
    takes_big_o = {n.id for n in COMMANDS if any(_long(p) == "--output-file" for p in n.options)}
    assert takes_o <= takes_big_o, f"-o without -O: {sorted(takes_o - takes_big_o)}"
    proven = set(DATA_COMMANDS) | set(CLUSTER_DATA_COMMANDS) | set(ARCHIVE_COMMANDS)
    assert takes_big_o <= proven, f"add to DATA_COMMANDS: {takes_big_o - proven}"


def _tiny_tree(root: Path) -> Path:
    """A one-dir tree of one script and its manifest (what ``image build --tree`` takes)."""
    from meshctl import tree
    from meshctl.core.tree import MANIFEST_NAME

    root.mkdir()
    (root / "meshctl").write_text("#!/bin/sh\necho meshctl\n")
    (root / "meshctl").chmod(0o755)
    (root / MANIFEST_NAME).write_bytes(tree.scan(root, "meshctl").render())
    return root


def _tiny_archive(path: Path) -> Path:
    from meshctl.image import oci

    layer = oci.Layer("one", (oci.file_bytes("/hello", b"hi\n"),))
    image = oci.Image(repository="localhost/t", tag="1", layers=(layer,), entrypoint=("/hello",))
    oci.write_archive(image, path)
    return path


@pytest.mark.parametrize("command", sorted(DATA_COMMANDS))
def test_output_file_holds_exactly_what_stdout_would(command, capsys, tmp_path):
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(
        "kind: Pod\napiVersion: v1\nmetadata: {name: a}\nspec: {containers: [{name: a}]}\n"
    )
    pem = tmp_path / "ca.crt"
    pem.write_text("-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n")
    gateway = tmp_path / "gateway.yaml"
    gateway.write_text(MINIMAL)
    places = {
        "manifest": manifest,
        "pem": pem,
        "missing": tmp_path / "no-kubeconfig",
        "gateway": gateway,
        "tree": _tiny_tree(tmp_path / "tree"),
        "archive": _tiny_archive(tmp_path / "image.tar"),
    }
    args = [a.format(**places) for a in DATA_COMMANDS[command]]
    code, out, err = run(capsys, *command.split(), *args)
    target = tmp_path / "out" / "data.txt"
    target.parent.mkdir()
    code_o, out_o, err_o = run(capsys, *command.split(), *args, "-O", str(target))
    assert (code_o, code) in ((0, 0), (3, 3)), err + err_o
    assert out, f"meshctl {command} printed nothing"
    assert out_o == ""
    assert target.read_text() == out


@pytest.mark.parametrize("plugin", ["cni", "controlplane", "ztunnel"])
def test_a_manifest_command_puts_its_namespace_first(plugin, capsys):
    code, out, err = run(capsys, plugin, "manifest", "-n", "mesh-x", "-o", "json")
    assert code == 0, err
    first = json.loads(out)["items"][0]
    assert (first["kind"], first["metadata"]["name"]) == ("Namespace", "mesh-x")
