"""The base layer of the meshctl image: files of Debian packages installed on the build machine.

The frozen tree needs the libraries PyInstaller leaves to the system (glibc, and zlib for the
bootloader itself): ``linked_packages`` finds them from the tree's ELF files (``objdump -p``
NEEDED entries not provided inside the tree, resolved with ``ldconfig -p`` and ``dpkg -S``). The
capture code needs iptables (``libip4tc``/``libxtables`` and their extensions, loaded with ctypes,
for the in-process backend; ``iptables-{legacy,nft}-restore`` for the others). The layer holds
the closure of those packages under Depends/Pre-Depends, as the dpkg database lists it, minus
documentation and the iconv modules (nothing in the image calls iconv(3); Python brings its own
codecs). The packages are the ones the binary was frozen against, on the same machine.

Debian 12 merged /bin, /sbin and /lib into /usr: files land at their /usr path and the image gets
the same top-level symlinks. Commands that Debian provides through update-alternatives
(``iptables`` -> ``iptables-nft``, ...) get the links a fresh install makes (the highest priority
among the alternatives in the image), whatever this machine's admin chose.
``/var/lib/dpkg/status.d/<package>`` records what is inside (as distroless images do), so image
scanners can tell which Debian packages the image carries.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from meshctl.image.oci import Entry, directory, file_bytes, file_from, symlink

ROOTS = ("iptables",)  # besides what the tree links against
SKIP = (
    "/usr/share/doc/",
    "/usr/share/man/",
    "/usr/share/info/",
    "/usr/share/lintian/",
    "/usr/share/locale/",
    "/usr/share/bug/",
    "/usr/share/doc-base/",
)
SKIP_PATTERNS = (re.compile(r"^/usr/lib/[^/]+/gconv/"),)
MERGED = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


class RootfsError(RuntimeError):
    """The build machine cannot provide the base layer (a package is missing)."""


@dataclass(frozen=True, slots=True)
class Package:
    name: str
    version: str
    architecture: str


def _installed(name: str) -> list[str]:
    """Package, version, architecture and its Depends + Pre-Depends, of an installed package."""
    fields = (
        r"${db:Status-Status}\t${Package}\t${Version}\t${Architecture}\t${Depends}, ${Pre-Depends}"
    )
    done = subprocess.run(
        ["dpkg-query", "-W", f"-f={fields}", name], capture_output=True, text=True, check=False
    )
    status, *values = (done.stdout.split("\t") + [""] * 5)[:5]
    if done.returncode != 0 or status != "installed":
        raise RootfsError(
            f"Debian package {name} is not installed on this machine (apt-get install {name})"
        )
    return values


def _depends(line: str) -> list[list[str]]:
    """A Depends field as clauses of alternatives (package names, versions dropped)."""
    clauses = []
    for clause in filter(None, (c.strip() for c in line.split(","))):
        clauses.append([alt.split()[0].split(":")[0] for alt in clause.split("|") if alt.strip()])
    return clauses


def version(name: str) -> str:
    """The installed version of package ``name``; ``RootfsError`` if it is not installed."""
    return _installed(name)[1]


def closure(roots: tuple[str, ...] = ROOTS) -> list[Package]:
    """Every installed package ``roots`` need (of alternatives: the first installed), by name."""
    seen: dict[str, Package] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        package, version, arch, depends = _installed(name)
        seen[name] = Package(package, version, arch)
        for alternatives in _depends(depends):
            chosen = next((a for a in alternatives if a in seen or _is_installed(a)), None)
            todo.append(chosen or alternatives[0])  # none installed: the error names the first
    return [seen[n] for n in sorted(seen)]


def _is_installed(name: str) -> bool:
    try:
        _installed(name)
    except RootfsError:
        return False
    return True


def linked_packages(tree: Path, files: list[str], executable: str) -> list[str]:
    """The Debian packages holding the libraries the tree's ELF ``files`` need from the system.

    The executable (PyInstaller's bootloader) starts before anything in the tree is on the
    loader's path, so each of its libraries must come from the system even if the tree has one.
    """
    inside = {posixpath.basename(f) for f in files}
    needed: set[str] = set()
    for rel in files:
        path = tree / rel
        with path.open("rb") as head:
            if head.read(4) != b"\x7fELF":
                continue
        dump = subprocess.run(
            ["objdump", "-p", str(path)], capture_output=True, text=True, check=False
        ).stdout
        names = {line.split()[1] for line in dump.splitlines() if line.strip().startswith("NEEDED")}
        needed |= names if rel == executable else names - inside
    known: dict[str, str] = {}
    for line in subprocess.run(
        ["ldconfig", "-p"], capture_output=True, text=True, check=True
    ).stdout.splitlines()[1:]:
        name, _, where = line.strip().partition(" => ")
        if "x86-64" in name or "64bit" in name or "AArch64" in name:
            known.setdefault(name.split()[0], where)
    packages = set()
    for soname in sorted(needed):
        if soname not in known:
            raise RootfsError(f"the tree needs {soname}, which no installed library provides")
        packages.add(_owner(known[soname]))
    return sorted(packages)


def _owner(path: str) -> str:
    """The package owning ``path`` (dpkg records merged-/usr files under either spelling)."""
    spellings = (
        [path, path.removeprefix("/usr")] if path.startswith("/usr/") else [path, f"/usr{path}"]
    )
    for spelling in spellings:
        done = subprocess.run(
            ["dpkg-query", "-S", spelling], capture_output=True, text=True, check=False
        )
        if done.returncode == 0:
            return done.stdout.split(":")[0]
    raise RootfsError(f"no installed Debian package owns {path}")


def _image_path(listed: str) -> str:
    """Where a file dpkg lists lands in the image: below its directory as the host resolves it."""
    parent, name = posixpath.split(listed)
    return posixpath.join(os.path.realpath(parent), name)


def _skipped(path: str) -> bool:
    return path.startswith(SKIP) or any(p.match(path) for p in SKIP_PATTERNS)


def entries(packages: list[Package]) -> list[Entry]:
    """The files, directories and symlinks of ``packages`` as the host has them."""
    found: dict[str, Entry] = {}
    for name in MERGED:
        host = Path("/", name)
        if host.is_symlink():
            found[f"/{name}"] = symlink(f"/{name}", str(host.readlink()))
    for package in packages:
        listed = subprocess.run(
            ["dpkg-query", "-L", package.name], capture_output=True, text=True, check=True
        ).stdout
        for line in listed.splitlines():
            if not line.startswith("/") or line == "/." or line.startswith("diverted"):
                continue
            host = Path(line)
            path = _image_path(line)
            if _skipped(path + "/") or path in found or _skipped(path):
                continue
            try:
                info = host.lstat()
            except FileNotFoundError:
                continue  # removed by the admin (dpkg --path-exclude); not needed then
            if stat.S_ISLNK(info.st_mode):
                found[path] = symlink(path, str(host.readlink()))
            elif stat.S_ISDIR(info.st_mode):
                found[path] = directory(path)
            elif stat.S_ISREG(info.st_mode):
                found[path] = file_from(path, host, stat.S_IMODE(info.st_mode) & 0o755)
        status = subprocess.run(
            ["dpkg-query", "-s", package.name], capture_output=True, text=True, check=True
        ).stdout
        record = f"/var/lib/dpkg/status.d/{package.name}"
        found[record] = file_bytes(record, status.encode())
    return list(found.values())


ALTERNATIVES_DB = Path("/var/lib/dpkg/alternatives")


def alternatives(present: set[str], db: Path = ALTERNATIVES_DB) -> list[Entry]:
    """The update-alternatives links a fresh install of the packages in ``present`` would make.

    Each file of dpkg's alternatives database: mode, link, slave (name, link) pairs up to a blank
    line, then per alternative its path, priority and one path per slave (empty: none).
    """
    links: list[Entry] = []
    for group in sorted(db.iterdir()) if db.is_dir() else []:
        lines = group.read_text().split("\n")
        link, slaves, i = lines[1], [], 2
        while lines[i]:
            slaves.append(lines[i + 1])
            i += 2
        i += 1
        best: tuple[int, list[str]] | None = None
        while i + 1 < len(lines) and lines[i]:
            path, priority = lines[i], int(lines[i + 1])
            paths = [path, *lines[i + 2 : i + 2 + len(slaves)]]
            i += 2 + len(slaves)
            if path in present and (best is None or priority > best[0]):
                best = (priority, paths)
        if best is None:
            continue
        for name, target in zip([link, *slaves], best[1], strict=True):
            if target:
                links.append(symlink(_image_path(name), target))
    return links


# The image's accounts ("x": no password anywhere; nologin shells).
ACCOUNTS = """root:x:0:0:root:/root:/usr/sbin/nologin
istio-proxy:x:1337:1337:meshctl proxy:/nonexistent:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
"""
GROUP = """root:x:0:
istio-proxy:x:1337:
nogroup:x:65534:
"""
# Without this file glibc asks DNS before /etc/hosts.
NSSWITCH = """passwd: files
group: files
hosts: files dns
networks: files
protocols: files
services: files
"""


def system_files() -> list[Entry]:
    """The few files a base image has that no package above ships: users, NSS, scratch dirs."""
    return [
        file_bytes("/etc/passwd", ACCOUNTS.encode()),
        file_bytes("/etc/group", GROUP.encode()),
        file_bytes("/etc/nsswitch.conf", NSSWITCH.encode()),
        file_bytes("/etc/os-release", Path("/etc/os-release").read_bytes()),
        directory("/tmp", 0o1777),  # noqa: S108 (the image's own /tmp, sticky as usual)
        directory("/run"),
        symlink("/var/run", "../run"),
        directory("/root", 0o700),
    ]
