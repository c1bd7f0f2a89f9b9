"""The ``iptc`` backend: python-iptables (libiptc) in-process, legacy iptables only, no fork/exec.

Invariants:
- python-iptables is imported without running anything: stock ``import iptc`` runs ``modprobe``,
  ``ldconfig`` and even ``gcc`` to find its libraries (~200 ms); ``load()`` points it at the
  libraries directly and skips the modprobe (the kernel autoloads ``ip_tables`` on first use).
  ``load()`` also adapts two python-iptables behaviours (each documented where it is done):
  extensions usable for both address families in one process, and no save/parse round trip per
  rule.
- python-iptables caches one ``Table`` per name per process, holding a libiptc handle bound to the
  namespace it was opened in. Every operation here re-opens the handles it uses inside the current
  namespace (``refresh``) and drops them from the cache when done, so switching namespaces between
  calls can never read or write through a stale handle.
- ``write`` builds every change of every table before committing any; each table commits
  atomically; the rules it writes read back (``read``) equal to the model, as iptables-save does.
- No iptc object leaves this module: ``read`` returns the rule model.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import importlib.util
import ipaddress
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from meshctl.core.capture.parse import RuleParseError, parse_rule
from meshctl.core.capture.render import transition
from meshctl.core.capture.rules import (
    BUILTIN_CHAINS,
    Chain,
    Family,
    Rule,
    RuleSet,
    Table,
    is_builtin,
)
from meshctl.errors import NetError

# Where distributions keep shared libraries (Debian multiarch first), as (root, glob) pairs.
_LIB_DIRS = (
    ("/usr/lib", "*-linux-gnu"),
    ("/lib", "*-linux-gnu"),
    ("/usr", "lib64"),
    ("/", "lib64"),
    ("/usr", "lib"),
    ("/", "lib"),
)
_PROC_TABLES = {Family.IPV4: "ip_tables_names", Family.IPV6: "ip6_tables_names"}


def _library_dirs() -> list[Path]:
    return [
        d for root, pattern in _LIB_DIRS for d in sorted(Path(root).glob(pattern)) if d.is_dir()
    ]


def _find_library_without_exec(name: str) -> str | None:
    """``ctypes.util.find_library`` without its ``ldconfig``/``gcc`` subprocesses."""
    stem = name if name.startswith("lib") else f"lib{name}"
    for directory in _library_dirs():
        # The soname (libc.so.6, libip4tc.so.2) as ldconfig would answer; a bare .so may be a
        # linker script (libc.so is), so it is taken only when it is an ELF object.
        versioned = sorted(directory.glob(f"{stem}.so.*"), key=lambda p: len(p.name))
        if versioned:
            return str(versioned[0])
        bare = directory / f"{stem}.so"
        if bare.is_file():
            with bare.open("rb") as head:
                if head.read(4) == b"\x7fELF":
                    return str(bare)
    return None


def load() -> ModuleType:
    """Import python-iptables once, without subprocesses; ``NetError`` when it cannot load."""
    if "iptc" in sys.modules:
        return sys.modules["iptc"]
    xtables = next((d / "xtables" for d in _library_dirs() if (d / "xtables").is_dir()), None)
    if xtables is not None:
        # python-iptables reads this instead of parsing `ldconfig -N -v` output.
        os.environ.setdefault("XTABLES_LIBDIR", str(xtables))
    spec = importlib.util.find_spec("iptc")
    if spec is None or spec.loader is None:
        raise NetError("python-iptables is not installed", hint="use --backend legacy or nft")
    real_find_library = ctypes.util.find_library
    ctypes.util.find_library = _find_library_without_exec
    # iptc/util.py tries distutils (setuptools' shim costs ~60 ms) before falling back to
    # sysconfig; a None entry makes that import fail at once. Restored below.
    hide_distutils = "distutils" not in sys.modules
    if hide_distutils:
        sys.modules["distutils"] = None  # type: ignore[assignment]
    package = importlib.util.module_from_spec(spec)
    sys.modules["iptc"] = package
    try:
        # Run iptc/util.py first and neuter its modprobe, then the package (which imports ip4tc,
        # whose import-time `load_kernel("ip_tables")` now finds the no-op).
        # Plain import statements (not importlib calls) so that PyInstaller's analysis sees them.
        import iptc.util

        iptc.util.load_kernel = lambda *_args, **_kwargs: None
        spec.loader.exec_module(package)
    except Exception as exc:  # a missing libxtables surfaces as anything from OSError up
        for name in [m for m in sys.modules if m == "iptc" or m.startswith("iptc.")]:
            del sys.modules[name]
        raise NetError(
            f"python-iptables cannot load libiptc/libxtables: {type(exc).__name__}: {exc}",
            hint="install the iptables package (libip4tc, libxtables) or use --backend nft",
        ) from exc
    finally:
        ctypes.util.find_library = real_find_library
        if hide_distutils:
            del sys.modules["distutils"]
    import iptc.ip4tc
    import iptc.xtables

    _allow_both_families(iptc.xtables)
    _final_check_without_reparse(iptc.ip4tc)
    return package


def _final_check_without_reparse(ip4tc: ModuleType) -> None:
    """Keep python-iptables' final check of a match or target, minus its re-serialisation.

    Before each append it prints every match and target through xtables' ``save`` (a dup2/pipe
    round trip per extension) and parses that text back; ours were just built by ``parse`` and
    are final already. Skipping the round trip is about a third of an apply; the parity tests
    compare the result with iptables-legacy-restore's, byte for byte.
    """

    def final_check(self: Any) -> None:
        if self._module:
            self._final_check()

    ip4tc.IPTCModule.final_check = final_check


def _allow_both_families(xtables_module: ModuleType) -> None:
    """Let one process use an extension for IPv4 *and* IPv6 (a dual-stack apply).

    libxtables registers an extension only for the address family that is current when its
    ``.so`` is loaded, and loading the same file again runs nothing, so python-iptables reports
    "can't find target REDIRECT" for the second family. Before the first lookup of an extension
    for a second family, load a private copy of its file with that family current: a new file is
    a new load and registers for it. (Loading the copy only after a failed lookup does not work:
    libxtables has dropped the name by then.) Copies are deleted once loaded.
    """
    cls = xtables_module.xtables
    libdir = Path(xtables_module._xtables_libdir)
    families: dict[bytes, set[int]] = {}

    def preload(xt: Any, name: bytes) -> None:
        text = name.decode()
        with tempfile.TemporaryDirectory(prefix="meshctl-xt-") as private:
            for prefix in ("libxt_", xt._get_prefix()):
                source = libdir / f"{prefix}{text}.so"
                if source.is_file():
                    copy = Path(private, source.name)
                    shutil.copyfile(source, copy)
                    cls._xtables_set_nfproto(xt.proto)
                    ctypes.CDLL(str(copy))  # the constructor registers for xt.proto

    def tracking(find: Any) -> Any:
        def lookup(xt: Any, name: str | bytes) -> Any:
            key = xt._check_extname(name.encode() if isinstance(name, str) else name)
            seen = families.setdefault(key, set())
            if seen and xt.proto not in seen:
                preload(xt, key)
            found = find(xt, name)
            if found:
                seen.add(xt.proto)
            return found

        return lookup

    cls.find_match = tracking(cls.find_match)
    cls.find_target = tracking(cls.find_target)


def existing_tables(family: Family) -> list[str]:
    """Legacy tables that exist in the calling thread's namespace (none if x_tables is unused).

    Read from /proc, not libiptc: opening a table through libiptc would create it.
    """
    try:
        names = Path(f"/proc/thread-self/net/{_PROC_TABLES[family]}").read_text(encoding="ascii")
    except FileNotFoundError:
        return []
    return sorted(n for n in names.split() if n in BUILTIN_CHAINS)


class IptcBackend:
    """Reads and writes legacy iptables of the current namespace through libiptc."""

    name = "iptc"
    variant = "legacy"

    def __init__(self) -> None:
        self._iptc = load()

    @contextlib.contextmanager
    def _tables(self, family: Family, names: list[str]) -> Iterator[dict[str, Any]]:
        cls = self._iptc.Table if family is Family.IPV4 else self._iptc.Table6
        opened: dict[str, Any] = {}
        try:
            for name in names:
                table = cls(name, autocommit=False)
                table.refresh()  # a handle for *this* namespace (the cached one may be another's)
                opened[name] = table
            # python-iptables decides whether a target names a chain by opening *every* table
            # (Rule.tables), which would create absent tables here and consult cached handles of
            # other namespaces. Declaring exactly the tables opened above as the available ones
            # keeps that lookup inside this namespace and these handles.
            cls.existing_table_names.clear()
            cls.existing_table_names.update({n: n in opened for n in cls.ALL})
            yield opened
        except self._iptc.IPTCError as exc:
            raise NetError(
                f"libiptc: {exc}",
                hint="is the netfilter module loaded (iptable_nat, xt_owner, xt_REDIRECT ...)?",
            ) from exc
        finally:
            for name, table in opened.items():
                with contextlib.suppress(Exception):
                    table.close()  # autocommit is off: closing discards uncommitted changes
                cls._cache.pop(name, None)
            cls.existing_table_names.clear()

    def read(self, family: Family) -> RuleSet:
        names = existing_tables(family)
        tables = []
        with self._tables(family, names) as opened:
            for name, table in opened.items():
                chains = []
                for chain in table.chains:
                    policy = chain.get_policy().name if table.builtin_chain(chain.name) else None
                    rules = tuple(self._to_model(r, family) for r in chain.rules)
                    chains.append(Chain(chain.name, rules, policy))
                tables.append(Table(name, tuple(chains)))
        return RuleSet(family, tuple(tables)).canonical()

    def write(self, family: Family, installed: RuleSet, desired: RuleSet) -> str:
        """Make the namespace's legacy tables hold ``desired`` instead of ``installed``.

        Returns the equivalent ``iptables-restore`` input (empty when nothing changed).
        """
        text = transition(installed, desired)
        if not text:
            return ""
        installed, desired = installed.ours(), desired.ours()
        names = sorted(
            t.name
            for t in (*installed.tables, *desired.tables)
            if installed.table(t.name) != desired.table(t.name)
        )
        names = list(dict.fromkeys(names))
        with self._tables(family, names) as opened:
            for name, table in opened.items():
                self._stage(table, family, installed.table(name), desired.table(name))
            for table in opened.values():
                table.commit()
        return text

    def _stage(self, table: Any, family: Family, old: Table | None, new: Table | None) -> None:
        iptc = self._iptc
        wanted = [c.name for c in (new.user_chains() if new else [])]
        present = {c.name for c in (old.user_chains() if old else [])}
        # Delete our jumps by their spec (as `-D` does), not through rule objects read from the
        # chain: those point into libiptc's cache, which each deletion rearranges.
        for chain in old.chains if old else ():
            if is_builtin(old.name if old else "", chain.name):
                handle = iptc.Chain(table, chain.name)
                for rule in chain.rules:
                    handle.delete_rule(self._to_iptc(rule, family))
        for name in wanted:
            if table.is_chain(name):
                table.flush_entries(name)
            else:
                table.create_chain(name)
        obsolete = [c for c in present if c not in wanted]
        for name in obsolete:
            table.flush_entries(name)
        for chain in new.chains if new else ():
            handle = iptc.Chain(table, chain.name)
            for rule in chain.rules:
                handle.append_rule(self._to_iptc(rule, family))
        for name in obsolete:
            table.delete_chain(name)

    def _to_iptc(self, rule: Rule, family: Family) -> Any:
        iptc = self._iptc
        out = iptc.Rule() if family is Family.IPV4 else iptc.Rule6()
        for attr, crit in (
            ("src", rule.source),
            ("dst", rule.destination),
            ("in_interface", rule.in_interface),
            ("out_interface", rule.out_interface),
            ("protocol", rule.protocol),
        ):
            if crit is not None:
                setattr(out, attr, ("!" if crit.negated else "") + crit.value)
        if rule.fragment is not None:
            out.fragment = not rule.fragment.negated
        try:
            for match in rule.matches:
                handle = iptc.Match(out, match.module)
                for option in match.options:
                    handle.parse(
                        option.name, ["!", *option.args] if option.negated else list(option.args)
                    )
                out.add_match(handle)
            if rule.target is not None:
                target = iptc.Target(out, rule.target.name, goto=rule.target.goto or None)
                for option in rule.target.options:
                    target.parse(
                        option.name, ["!", *option.args] if option.negated else list(option.args)
                    )
                out.target = target
        except (iptc.XTablesError, ValueError, AttributeError) as exc:
            raise NetError(
                f"libiptc rejected rule {' '.join(rule.words())!r}: {exc}",
                hint="a netfilter extension may be missing; try --backend legacy for details",
            ) from exc
        return out

    def _to_model(self, rule: Any, family: Family) -> Rule:
        """An iptc rule spelled the way iptables-save prints it, parsed into the model."""
        words: list[str] = []
        for flag, value in (("-s", rule.src), ("-d", rule.dst)):
            crit = _address(value, family)
            if crit is not None:
                words += _crit_words(flag, crit)
        for flag, value in (("-i", rule.in_interface), ("-o", rule.out_interface)):
            if value:
                words += _crit_words(flag, value)
        protocol = rule.protocol
        if protocol and protocol.lstrip("!") not in ("ip", "all", "0", "ipv6"):
            words += _crit_words("-p", protocol)
        for match in rule.matches:
            words += ["-m", match.name, *shlex.split(_saved(match, rule))]
        target = rule.target
        if target is not None and target.name:
            words += [
                "-g" if target.goto else "-j",
                target.name,
                *shlex.split(_saved(target, rule)),
            ]
        try:
            return parse_rule(words)
        except RuleParseError as exc:
            raise NetError(f"cannot read a legacy rule through libiptc: {exc.message}") from exc


def _crit_words(flag: str, value: str) -> list[str]:
    return ["!", flag, value[1:]] if value.startswith("!") else [flag, value]


def _address(value: str | None, family: Family) -> str | None:
    """python-iptables' ``10.0.0.0/255.0.0.0`` as iptables-save's ``10.0.0.0/8``; None for any."""
    if not value:
        return None
    bang = "!" if value.startswith("!") else ""
    address, _, mask = value.lstrip("!").partition("/")
    network = ipaddress.ip_network(
        f"{address}/{mask or ('32' if family is Family.IPV4 else '128')}"
    )
    if network.prefixlen == 0:
        return None
    return f"{bang}{network}"


def _saved(extension: Any, rule: Any) -> str:
    """The extension's own save text (python-iptables captures xtables' ``save`` callback)."""
    buf = extension._get_saved_buf(rule.get_ip())  # the only exact spelling python-iptables has
    if not buf:
        return ""
    return buf.decode() if isinstance(buf, bytes) else str(buf)
