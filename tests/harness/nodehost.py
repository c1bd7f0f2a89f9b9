"""The host side of the test node: what it changes on the machine, and how all of it is undone.

Owns: the before-snapshot (sysctls, nft tables, iptables chains, the host-global paths kubelet,
containerd and CNI write to, cgroup tops), written to a state file *before* anything changes; the
node bridge, its unreachable service route and the forwarding guard; and one idempotent cleanup
derived from the snapshot, run at teardown and by the next start after a killed run.
Invariants: forwarding is on only while the guard table is in place, and the guard accepts only
traffic from a port of the node bridge to a port of it, and while a second node runs
(tests/harness/node2.py) between the bridge and that node's link (no pod traffic can leave the
machine);
cleanup never removes an entry that existed before the start (the machine's own CNI files stay).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_DIR = Path("/var/lib/meshctl-test-node")
LOCK_FILE = STATE_DIR / "lock"
STATE_FILE = STATE_DIR / "state.json"
WORKDIR = STATE_DIR / "node"  # every root/state dir of the node's components lives under it
BRIDGE = "mtnode0"
GUARD_TABLE = "meshctl_node_guard"  # nft table, family inet
# The cgroup every pod and container lives under (kubelet's cgroupRoot), in every hierarchy.
CGROUP_ROOT = "meshctl-test-node"
CGROUP_FS = Path("/sys/fs/cgroup")
# Where kubelet, containerd, libcni and our CNI DaemonSet write outside WORKDIR (host-global paths
# they do not let us move). Entries that existed before the start are never touched.
HOST_PATHS = (
    "/etc/cni",
    "/etc/cni/net.d",
    "/opt/cni",
    "/opt/cni/bin",
    "/run/containerd",
    "/var/lib/kubelet",
    "/var/lib/cni",
    "/var/log/containers",
    "/var/log/pods",
    "/run/meshctl-cni",  # the CNI DaemonSet's run dir (/var/run links here)
    "/run/ztunnel",  # the ambient agent's ZDS socket dir (its hostPath makes it)
    "/run/nri",
    "/opt/containerd",
)
# Tables kube-proxy (nftables mode) and iptables-nft (kubelet's chains) create on the host.
NFT_TABLES_OURS = {("ip", "kube-proxy"), ("ip6", "kube-proxy"), ("inet", GUARD_TABLE)}
IPTABLES_TOOLS = ("iptables-nft", "ip6tables-nft", "iptables-legacy", "ip6tables-legacy")
# Sysctls that change by themselves (counters, entropy) or are write-only triggers.
VOLATILE_SYSCTL_PREFIXES = (
    "kernel/random/",
    "kernel/ns_last_pid",
    "kernel/pty/nr",
    "kernel/tainted",
    "fs/dentry-state",
    "fs/inode-",
    "fs/file-nr",
    "fs/quota/",
    "net/netfilter/nf_conntrack_count",
    "vm/drop_caches",
    "vm/compact_memory",
    "vm/stat_refresh",
    "kernel/perf_event_max_sample_rate",  # the kernel lowers it itself under load
)
# Per-interface entries come and go with links (the node's veths): not host state to restore.
PER_LINK_SYSCTL = ("net/ipv4/conf/", "net/ipv6/conf/", "net/ipv4/neigh/", "net/ipv6/neigh/")


# ---------------------------------------------------------------------------------------------
# Snapshot


def read_sysctls() -> dict[str, str]:
    """Every readable, writable host sysctl that is not volatile (per-link ones: all/default)."""
    values: dict[str, str] = {}
    root = Path("/proc/sys")
    for path in root.rglob("*"):
        key = str(path.relative_to(root))
        if key.startswith(VOLATILE_SYSCTL_PREFIXES):
            continue
        if key.startswith(PER_LINK_SYSCTL) and key.split("/")[3] not in {"all", "default"}:
            continue
        try:
            if not path.is_file() or not path.stat().st_mode & 0o200:
                continue
            values[key] = path.read_text().strip()
        except OSError:
            continue  # some entries refuse reads (EIO, EPERM): not ours to restore
    return values


def nft_tables() -> set[tuple[str, str]]:
    """The host's nft tables as (family, name)."""
    out = _run(["nft", "list", "tables"]).stdout
    return {
        (parts[1], parts[2])
        for parts in (line.split() for line in out.splitlines())
        if len(parts) == 3
    }


def iptables_chains() -> dict[str, list[str]]:
    """Per iptables tool: its chains as 'table/chain', and every rule naming a MESH_ chain as
    'table/-A ...' (the node agent's probe SNAT goes into the node's tables; a run must leave
    none behind), for both backends, IPv4 and IPv6."""
    chains: dict[str, list[str]] = {}
    for tool in IPTABLES_TOOLS:
        proc = _run([f"{tool}-save"], check=False)
        table, found = "", []
        for line in proc.stdout.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":"):
                found.append(f"{table}/{line[1:].split()[0]}")
            elif line.startswith("-A ") and "MESH_" in line:
                found.append(f"{table}/{line}")
        chains[tool] = sorted(found)
    return chains


def path_entries(paths: Iterable[str] = HOST_PATHS) -> dict[str, list[str] | None]:
    """For each host path: its entries (names), or None when it does not exist."""
    entries: dict[str, list[str] | None] = {}
    for path in paths:
        try:
            entries[path] = sorted(p.name for p in Path(path).iterdir())
        except FileNotFoundError:
            entries[path] = None
        except NotADirectoryError:
            entries[path] = []
    return entries


def cgroup_tops() -> dict[str, list[str]]:
    """Top-level cgroup directories of every mounted hierarchy."""
    tops: dict[str, list[str]] = {}
    for hierarchy in hierarchies():
        tops[hierarchy.name] = sorted(p.name for p in hierarchy.iterdir() if p.is_dir())
    return tops


def host_links() -> list[str]:
    return sorted(p.name for p in Path("/sys/class/net").iterdir())


def mounts_under(prefixes: Iterable[str]) -> list[str]:
    """Mount points (from /proc/self/mountinfo) at or below any of ``prefixes``, deepest first."""
    wanted = tuple(p.rstrip("/") for p in prefixes)
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == p or point.startswith(p + "/") for p in wanted):
            points.append(point)
    return sorted(set(points), key=lambda p: (-p.count("/"), p))


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSnapshot:
    """The host state the node may change, as plain data (kept in the state file)."""

    sysctls: dict[str, str]
    nft_tables: list[list[str]]
    iptables: dict[str, list[str]]
    paths: dict[str, list[str] | None]
    cgroups: dict[str, list[str]]
    links: list[str]

    @classmethod
    def take(cls) -> HostSnapshot:
        return cls(
            sysctls=read_sysctls(),
            nft_tables=sorted([list(t) for t in nft_tables()]),
            iptables=iptables_chains(),
            paths=path_entries(),
            cgroups=cgroup_tops(),
            links=host_links(),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "sysctls": self.sysctls,
            "nft_tables": self.nft_tables,
            "iptables": self.iptables,
            "paths": self.paths,
            "cgroups": self.cgroups,
            "links": self.links,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HostSnapshot:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})

    def differences(self, other: HostSnapshot) -> list[str]:
        """What differs from ``other`` (empty: same host state), one line each."""
        found = []
        mine, theirs = self.to_json(), other.to_json()
        for section in ("nft_tables", "links"):
            added = sorted(map(str, set(map(str, theirs[section])) - set(map(str, mine[section]))))
            removed = sorted(set(map(str, mine[section])) - set(map(str, theirs[section])))
            found += [f"{section}: added {a}" for a in added] + [
                f"{section}: gone {r}" for r in removed
            ]
        for key in sorted(set(self.sysctls) | set(other.sysctls)):
            if self.sysctls.get(key) != other.sysctls.get(key):
                found.append(
                    f"sysctl {key}: {self.sysctls.get(key)!r} -> {other.sysctls.get(key)!r}"
                )
        for section in ("iptables", "paths", "cgroups"):
            for key in sorted(set(mine[section]) | set(theirs[section])):
                if mine[section].get(key) != theirs[section].get(key):
                    found.append(
                        f"{section} {key}: {mine[section].get(key)} -> {theirs[section].get(key)}"
                    )
        return found


# ---------------------------------------------------------------------------------------------
# State file


def write_state(state: Mapping[str, Any]) -> None:
    """Atomically records what a start is about to change (read back by the next start)."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = STATE_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    tmp.replace(STATE_FILE)


def read_state() -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(STATE_FILE.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RuntimeError(
            f"{STATE_FILE} is unreadable ({exc}): it records what a killed node run changed; "
            "inspect it, clean up by hand and delete it"
        ) from exc
    return data


@contextlib.contextmanager
def machine_lock(timeout: float) -> Iterator[None]:
    """One test node per machine: an exclusive flock on LOCK_FILE, waited for up to ``timeout``."""
    import fcntl

    STATE_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                    raise RuntimeError(
                        f"the test node is in use by another test session (pid {holder}; lock "
                        f"{LOCK_FILE}) and it did not finish within {timeout:.0f}s: wait for it, "
                        "or raise MESHCTL_NODE_LOCK_TIMEOUT"
                    ) from None
                time.sleep(1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the flock


# ---------------------------------------------------------------------------------------------
# Network: bridge, service route, forwarding guard


def guard_ruleset(bridge: str) -> str:
    """The nft table that makes forwarding safe: only bridge port -> bridge port passes."""
    return (
        f"table inet {GUARD_TABLE} {{\n"
        "  chain forward {\n"
        "    type filter hook forward priority -200; policy drop;\n"
        f'    iifname "{bridge}" oifname "{bridge}" accept\n'
        "  }\n"
        "}\n"
    )


def setup_network(bridge: str, node_cidr: str, service_cidr: str) -> None:
    """Bridge with the node address, no route off the machine for services, guarded forwarding."""
    _run(["ip", "link", "add", bridge, "type", "bridge"])
    _run(["ip", "addr", "add", node_cidr, "dev", bridge])
    _run(["ip", "link", "set", bridge, "up"])
    # Services route onto the bridge, never along the default route off the machine: the host
    # reaches ClusterIPs through kube-proxy's output DNAT (the CNI plugin reads pods that way),
    # and a ClusterIP without endpoints dies unanswered on the bridge.
    _run(["ip", "route", "add", service_cidr, "dev", bridge])
    _run(["nft", "-f", "-"], stdin=guard_ruleset(bridge))
    # Only now: forwarding with the guard already in place (pod -> ClusterIP -> pod needs it).
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1")


def guard_in_place(bridge: str = BRIDGE) -> bool:
    """The guard table exists and holds exactly the bridge-only accept and the drop policy."""
    proc = _run(["nft", "-j", "list", "table", "inet", GUARD_TABLE], check=False)
    if proc.returncode != 0:
        return False
    items = json.loads(proc.stdout)["nftables"]
    chains = [i["chain"] for i in items if "chain" in i]
    rules = [i["rule"] for i in items if "rule" in i]
    forward = [c for c in chains if c.get("hook") == "forward"]
    if len(forward) != 1 or forward[0].get("policy") != "drop" or len(rules) != 1:
        return False
    wanted = [
        {"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": bridge}},
        {"match": {"op": "==", "left": {"meta": {"key": "oifname"}}, "right": bridge}},
        {"accept": None},
    ]
    return bool(rules[0]["expr"] == wanted)


# ---------------------------------------------------------------------------------------------
# Cleanup (teardown, and the next start after a killed run)


def _run(
    argv: list[str], *, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, check=check, input=stdin, timeout=60
    )


def hierarchies() -> list[Path]:
    return sorted(p for p in CGROUP_FS.iterdir() if p.is_dir() and not p.is_symlink())


def _our_pids(workdir: Path) -> set[int]:
    """Node processes: in our cgroup (pods, shims) or naming WORKDIR on their command line."""
    pids: set[int] = set()
    marker = str(workdir).encode()
    for hierarchy in hierarchies():
        root = hierarchy / CGROUP_ROOT
        if root.is_dir():
            for procs in root.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(p) for p in procs.read_text().split())
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker in (proc / "cmdline").read_bytes():
                pids.add(int(proc.name))
    return pids


def kill_processes(workdir: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while pids := _our_pids(workdir):
        if time.monotonic() > deadline:
            raise RuntimeError(f"node processes still alive after SIGKILL: {sorted(pids)}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def unmount_all(prefixes: Iterable[str]) -> None:
    """Lazily unmounts everything at or below ``prefixes`` (bind mounts, tmpfs, overlays, netns)."""
    for _ in range(5):  # a bind mount can hide another one under it: repeat until none is left
        points = mounts_under(prefixes)
        if not points:
            return
        for point in points:
            subprocess.run(["umount", "-l", point], capture_output=True, check=False, timeout=30)
    if left := mounts_under(prefixes):
        raise RuntimeError(f"mounts left after cleanup: {left}")


def remove_cgroups() -> None:
    for hierarchy in hierarchies():
        root = hierarchy / CGROUP_ROOT
        if not root.is_dir():
            continue
        # Deepest first: a cgroup directory goes only once it has no children (rmdir, not rm).
        for cg in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            _rmdir_cgroup(cg)
        _rmdir_cgroup(root)


def _rmdir_cgroup(path: Path) -> None:
    for _ in range(50):
        try:
            path.rmdir()
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise
            time.sleep(0.1)  # a killed process leaves its cgroup a moment later
        else:
            return
    path.rmdir()


def remove_links(bridge: str) -> None:
    """Host veths the bridge plugin left on our bridge, then the bridge."""
    master = Path(f"/sys/class/net/{bridge}/brif")
    if master.is_dir():
        for port in master.iterdir():
            _run(["ip", "link", "del", port.name], check=False)
    _run(["ip", "link", "del", bridge], check=False)


def remove_new_iptables_chains(before: Mapping[str, list[str]]) -> None:
    """KUBE-* and MESH_* chains that appeared since the start, every rule that jumps to them,
    and every new rule naming a MESH_ chain (in chains that existed before, too)."""
    for tool in IPTABLES_TOOLS:
        save = _run([f"{tool}-save"], check=False).stdout
        existed = set(before.get(tool, []))
        table, new, jumps = "", [], []
        for line in save.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":"):
                chain = line[1:].split()[0]
                if chain.startswith(("KUBE-", "MESH_")) and f"{table}/{chain}" not in existed:
                    new.append((table, chain))
            elif line.startswith("-A "):
                jumps.append((table, line))
        names = {c for _, c in new}
        for table, rule in jumps:
            words = rule.split()
            ours = "MESH_" in rule and f"{table}/{rule}" not in existed
            if ours or words[1] in names or any(w in names for w in words[2:]):
                _run([tool, "-t", table, "-D", *words[1:]], check=False)
        for table, chain in new:
            _run([tool, "-t", table, "-F", chain], check=False)
        for table, chain in new:
            _run([tool, "-t", table, "-X", chain], check=False)


def remove_new_nft_tables(before: Iterable[Iterable[str]]) -> None:
    """Our tables, and iptables-nft tables that appeared since the start and are empty now."""
    existed = {(family, name) for family, name in before}
    for family, name in nft_tables() - existed:
        if (family, name) in NFT_TABLES_OURS or _nft_table_empty(family, name):
            _run(["nft", "delete", "table", family, name], check=False)


def _nft_table_empty(family: str, name: str) -> bool:
    proc = _run(["nft", "-j", "list", "table", family, name], check=False)
    if proc.returncode != 0:
        return False
    return not any("rule" in item for item in json.loads(proc.stdout)["nftables"])


def restore_sysctls(before: Mapping[str, str]) -> None:
    """Writes back every sysctl that differs from the snapshot (kubelet sets kernel.panic etc.)."""
    now = read_sysctls()
    for key, value in before.items():
        if now.get(key, value) != value:
            with contextlib.suppress(OSError):
                Path("/proc/sys", key).write_text(value)


def remove_new_paths(before: Mapping[str, list[str] | None]) -> None:
    """Entries created since the start in the host paths; paths that did not exist, whole."""
    import shutil

    def remove(target: Path) -> None:
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)

    # Deepest first, so a path that did not exist goes after its new entries were handled.
    for path in sorted(before, key=lambda p: -p.count("/")):
        existed = before[path]
        if existed is None:
            remove(Path(path))
            continue
        try:
            now = {p.name for p in Path(path).iterdir()}
        except FileNotFoundError:
            continue
        for name in now - set(existed):
            remove(Path(path) / name)


def leftovers(before: HostSnapshot) -> list[str]:
    """What a run left on the host that the cleanup should have removed: rules and chains,
    nft tables, links and entries under the host paths (sysctls and cgroups are the kernel's
    and kubelet's to settle); one line each, empty when the host is as before."""
    after = HostSnapshot.take()
    found = [
        d for d in before.differences(after) if d.startswith(("nft_tables: added", "links: added"))
    ]
    # Only what appeared: our agent may rightly have removed stale rules of an older run.
    for tool, now in after.iptables.items():
        found += [
            f"{tool}: {item}" for item in sorted(set(now) - set(before.iptables.get(tool, [])))
        ]
    for path, entries in after.paths.items():
        had = before.paths.get(path)
        if entries is not None and had is None:
            found.append(f"{path} was created")
        elif entries is not None:
            found += [f"{path}/{name}" for name in sorted(set(entries) - set(had or []))]
    return found


def cleanup(state: Mapping[str, Any]) -> None:
    """Undoes everything a start recorded in ``state`` (idempotent; safe on a half-done start)."""
    import shutil

    workdir = Path(state["workdir"])
    before = HostSnapshot.from_json(state["before"])
    kill_processes(workdir)
    unmount_all([str(workdir), *HOST_PATHS])
    remove_cgroups()
    remove_links(state["bridge"])
    for link in state.get("extra_links", []):  # a second node's link (tests/harness/node2.py)
        _run(["ip", "link", "del", link], check=False)
    _run(["ip", "route", "del", state["service_cidr"]], check=False)  # gone with the bridge too
    remove_new_iptables_chains(before.iptables)
    remove_new_nft_tables(before.nft_tables)
    restore_sysctls(before.sysctls)
    remove_new_paths(before.paths)
    shutil.rmtree(workdir, ignore_errors=True)
    STATE_FILE.unlink(missing_ok=True)
