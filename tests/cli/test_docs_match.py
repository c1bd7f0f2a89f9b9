"""The docs match the commands: every option a page names exists on the command it names.

Two readings of every page (docs/*.md and README.md): each ``meshctl ...`` command line (in code
spans and fenced blocks, continuation lines included) is resolved to its command through the
real tree, and every ``--option`` on it must be an option of that command, of a group above it
or of the root; every other ``--option`` a page mentions must exist on one of the commands the
page is about, unless it is another program's (listed below with whose it is).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from typer.core import TyperGroup

from tests.cli.test_conventions import TREE, Node

REPO = Path(__file__).resolve().parents[2]
PAGES = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")

# Which commands each page is about (its flags must be theirs); absent: every command.
PAGE_COMMANDS = {
    "ztunnel": ("ztunnel", "iptables", "install"),
    "cni": ("cni", "inject", "ztunnel", "install", "verify", "uninstall"),
    "controlplane": ("controlplane", "ztunnel", "inject"),
    "inject": ("inject", "ztunnel"),
    "install": ("install", "uninstall", "manifest", "verify", "version", "image"),
    "iptables": ("iptables",),
    "demo": ("demo", "ztunnel", "controlplane", "cni", "install"),
    "discovery": ("ztunnel", "controlplane"),
    "stat": ("stat", "top", "verify"),
}

# Flags of other programs the pages quote, by whose they are (never meshctl's).
FOREIGN = {
    "kubectl": {"--dry-run", "--show-managed-fields", "--token-auth-file", "--field-manager"},
    "istio-iptables (names meshctl iptables does not take)": {
        "--redirect-dns",
        "--capture-all-dns",
    },
    "iptables / iptables-restore": {
        "--noflush",
        "--uid-owner",
        "--gid-owner",
        "--dport",
        "--dports",
        "--to-ports",
        "--to-source",
        "--socket-exists",
        "--tcp",
    },
    "unshare, usermod (the rootless demo)": {
        "--user",
        "--map-root-user",
        "--map-auto",
        "--net",
        "--mount",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
        "--add-subuids",
        "--add-subgids",
    },
    "kube-apiserver, kubelet (the test cluster)": {
        "--service-cluster-ip-range",
        "--service-account-issuer",
        "--authorization-mode",
        "--endpoint-reconciler-type",
        "--kubelet-preferred-address-types",
        "--kubelet-client-certificate",
        "--kubelet-certificate-authority",
        "--unsafe-no-fsync",
    },
    "the data plane's and supervisor's hidden argv": {"--channel-fd", "--handover-fd"},
    "istioctl (ztunnel-config reading a saved dump)": {"--file"},
    "benchmarks and scripts (tests/bench, packaging, build.sh, pytest)": {
        "--smoke",
        "--gateway-api",
        "--profile",
        "--runs",
        "--baseline",
        "--binary",
        "--tree",
        "--images",
        "--regen",
        "--apiserver",
        "--istioctl",
        "--python",
        "--test",
        "--send",
        "--probe-timeout",
        "--check",
        "--out",
        "--name",
        "--native",
        "--h2c",
        "--grpc",
        "--http",
        "--grpc-service",
        "--slash--",
        "--istio-cni",
        "--start-then-wait",
        # the scale benchmarks (docs/scale.md)
        "--burst",
        "--burst-accounts",
        "--burst-channels",
        "--enrolled",
        "--identities",
        "--only",
        "--pods",
        "--profile-burst",
        "--py-spy",
        "--rate",
        "--requests",
        "--rps",
        "--samples",
        "--services",
        "--streams",
    },
    "istio-cni's install-cni (its version line)": {"--short"},
}
FOREIGN_FLAGS = set().union(*FOREIGN.values())


def _options(node: Node) -> set[str]:
    return {
        name
        for param in node.command.params
        for name in (*getattr(param, "opts", ()), *getattr(param, "secondary_opts", ()))
        if name.startswith("--")
    } | {"--help"}


BY_PATH = {n.path: n for n in TREE}
ROOT_OPTIONS = _options(BY_PATH[()])


def _resolve(words: list[str]) -> tuple[Node, list[str]]:
    """The command ``meshctl WORDS...`` names, and the words after its path."""
    node, rest, index = BY_PATH[()], [], 0
    while index < len(words):
        word = words[index]
        if word.startswith("-"):
            rest.append(word)
            takes_value = word in {"--kubeconfig", "--context", "--config", "--log-level"}
            if takes_value and index + 1 < len(words):
                index += 1
        elif isinstance(node.command, TyperGroup) and (*node.path, word) in BY_PATH:
            node = BY_PATH[(*node.path, word)]
        else:
            rest.append(word)
        index += 1
    return node, rest


def _command_lines(text: str) -> list[str]:
    """Every ``meshctl ...`` in code: inline spans and fenced blocks (indented continuation
    lines joined), cut at a pipe, ``;``, ``&&`` or the ``--`` before a pod's command."""
    found: list[str] = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.DOTALL):
        lines: list[str] = []
        for line in block.splitlines():
            # A usage line goes on indented with more options ([--x ...]); a diagram does not.
            if line[:1].isspace() and line.strip()[:1] in "[-" and lines:
                lines[-1] += " " + line.strip()
            else:
                lines.append(line.strip())
        found += [line for line in lines if line.startswith("meshctl ")]
    found += [span for span in re.findall(r"`([^`\n]+)`", text) if span.startswith("meshctl ")]
    # A pipe into another program (not a|b alternatives), ;, &&, the -- before a pod's
    # command, a comment, or an aside in parentheses after two spaces.
    cut = re.compile(r" \| (?=[a-z])| ; | && | -- |\s#|  \(")
    return [cut.split(line)[0] for line in found]


def _flags(words: list[str]) -> list[str]:
    return [m.group(0) for word in words for m in FLAG.finditer(word)]


def wrong_on_command_lines(text: str) -> list[str]:
    """``'LINE': --flag`` for each option a ``meshctl`` line gives its command without it."""
    wrong = []
    for line in _command_lines(text):
        node, rest = _resolve(line.split()[1:])
        allowed = set(ROOT_OPTIONS)
        for depth in range(len(node.path) + 1):
            allowed |= _options(BY_PATH[node.path[:depth]])
        wrong += [f"{line!r}: {flag}" for flag in _flags(rest) if flag not in allowed]
    return wrong


def unknown_on_page(text: str, plugins: tuple[str, ...] | None) -> list[str]:
    """Options the text names that no command of ``plugins`` (None: any) has, nor another
    program."""
    nodes = [n for n in TREE if plugins is None or (n.path[:1] and n.path[0] in plugins)]
    known = ROOT_OPTIONS.union(*(_options(n) for n in nodes)) | FOREIGN_FLAGS
    return sorted(set(FLAG.findall(text)) - known)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_option_on_a_meshctl_command_line_exists_on_that_command(page):
    wrong = wrong_on_command_lines(page.read_text())
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_option_a_page_names_is_an_option_of_its_commands(page):
    plugins = PAGE_COMMANDS.get(page.stem)
    unknown = unknown_on_page(page.read_text(), plugins)
    assert not unknown, f"{page.name} names options no command of {plugins or 'meshctl'} has"


def test_the_readings_see_the_pages_command_lines():
    """A guard for the reader itself: it finds what the pages certainly hold."""
    lines = _command_lines((REPO / "docs" / "inject.md").read_text())
    node, _ = _resolve(["inject", "webhook-config", "--ca-bundle", "F"])
    assert node.path == ("inject", "webhook-config")
    assert any(line.startswith("meshctl inject webhook-config") for line in lines)
    assert "--reinvocation-policy" in " ".join(lines)


def test_an_option_a_page_gives_the_wrong_command_or_invents_is_caught():
    page = textwrap.dedent("""
        Run `meshctl ztunnel run --grpc-address :1` (that is controlplane's), then:

        ```
        meshctl inject webhook --tls-cert F --tls-key K
                       [--drain-deadline 5s] [--no-such-flag]
        meshctl demo exec client -- curl --fail http://x   # curl's flags are not ours
        ```
        The old --drain-minutes is gone.
    """)
    usage = "meshctl inject webhook --tls-cert F --tls-key K [--drain-deadline 5s] [--no-such-flag]"
    assert sorted(wrong_on_command_lines(page)) == [
        f"'{usage}': --no-such-flag",
        "'meshctl ztunnel run --grpc-address :1': --grpc-address",
    ]
    assert unknown_on_page(page, ("inject",)) == [
        "--drain-minutes",
        "--fail",
        "--grpc-address",
        "--no-such-flag",
    ]
