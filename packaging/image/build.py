"""Build meshctl's container images as tarballs, without a container daemon or a registry.

Usage: python packaging/image/build.py --out DIR [--tree dist/meshctl-tree] [--no-cache] [NAME...]

NAME is one of ``IMAGES`` (default: all but ``ON_REQUEST``). For each, writes ``DIR/<name>.tar``
(an OCI layout that is also a ``docker save`` archive; see oci.py), importable with
``ctr -n k8s.io images import DIR/<name>.tar`` under the tag below, and ``DIR/images.json``
(name -> ref, file, digest). Tarballs are cached by a digest of everything in them under
``$MESHCTL_BUILD_CACHE/images`` (default ``~/.cache/meshctl-build``): unchanged inputs are never
rebuilt, only copied. Exits 1 with a one-line reason when an input is missing.

- ``meshctl`` -> ``localhost/meshctl:<version>``: the frozen one-dir tree at /opt/meshctl
  (``/usr/local/bin/meshctl`` links to it) over a base layer of Debian files (rootfs.py).
- ``pause`` -> ``localhost/meshctl-pause:<version>``: the pod sandbox process (pause.c, static).
- ``testapp`` -> ``localhost/meshctl-testapp:<version>``: ``meshtest`` (testapp/main.go, static Go:
  HTTP/TCP/gRPC-health server and client) and Debian's busybox-static for shell tools.
- ``echo-basic`` -> every ``registry.k8s.io/gateway-api/echo-basic:<tag>`` the Gateway API
  conformance suite's manifests name: the suite's echo backend, built by tests/kube/build.sh from
  the suite's Go module (so the node never pulls).
- ``coredns`` -> the ``registry.k8s.io/coredns/coredns:<tag>`` of the suite's base manifests, built
  by tests/kube/build.sh from CoreDNS's Go module.
- ``istio-cni`` -> ``localhost/istio-install-cni:<module version>``: Istio's CNI node agent
  (``install-cni``, the ambient node agent with its ZDS server) and the plugin it installs
  (``/opt/cni/bin/istio-cni``), built by tests/kube/build.sh --istio-cni from the Istio Go module
  tests/harness/istio.py pins, over the Debian iptables files the agent runs in pods; /host/proc
  is the container's own /proc (see ``istio_cni_image``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

from meshctl import __version__  # noqa: E402
from meshctl.core.k8s.image import PAUSE_REPOSITORY, TESTAPP_REPOSITORY  # noqa: E402
from meshctl.errors import MeshctlError  # noqa: E402
from meshctl.image import oci, product, rootfs  # noqa: E402

KEEP_PER_IMAGE = 3  # cached tarballs kept per image (the newest)
labels = product.labels


class BuildError(RuntimeError):
    """An input is missing or broken; the message says which and how to get it."""


def cache_root() -> Path:
    return Path(os.environ.get("MESHCTL_BUILD_CACHE", Path.home() / ".cache" / "meshctl-build"))


# --- meshctl: the product's own recipe (meshctl image build writes the same image) -------------


def meshctl_image(tree: Path) -> oci.Image:
    """The frozen tree at /opt/meshctl over the Debian base layer (meshctl/image/product.py)."""
    try:
        return product.tree_image(tree)
    except MeshctlError as exc:
        raise BuildError(f"{exc.message} ({exc.hint})" if exc.hint else exc.message) from exc


# --- pause and testapp: small compiled programs, cached by their inputs -------------------------


def _tool_version(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BuildError(f"{argv[0]} is needed to build the test images: {exc}") from exc


def compiled(name: str, inputs: list[Path], toolchain: str, build: Callable[[Path], None]) -> Path:
    """The program ``build`` writes to its argument, cached by ``inputs`` and ``toolchain``."""
    key = hashlib.sha256(toolchain.encode())
    for path in inputs:
        key.update(path.name.encode() + b"\0" + path.read_bytes())
    out = cache_root() / "programs" / f"{name}-{key.hexdigest()[:16]}"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    try:
        build(tmp)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    older = sorted(out.parent.glob(f"{name}-*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in older[KEEP_PER_IMAGE:]:
        old.unlink(missing_ok=True)
    return out


def _gcc() -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BuildError("gcc not found: apt-get install gcc libc6-dev (builds the pause image)")
    return gcc


def pause_program() -> Path:
    source = HERE / "pause.c"
    gcc = _gcc()
    toolchain = _tool_version([gcc, "--version"]) + rootfs.version("libc6-dev")

    def build(out: Path) -> None:
        done = subprocess.run(
            [gcc, "-static", "-O2", "-s", "-Wall", "-Werror", "-o", str(out), str(source)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise BuildError(f"gcc -static pause.c failed: {done.stderr.strip()}")

    return compiled("pause", [source], toolchain, build)


def _go() -> str:
    for candidate in (shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise BuildError("no Go toolchain (go >= 1.24 on PATH or /usr/local/go/bin/go) for meshtest")


def testapp_program() -> Path:
    go = _go()
    sources = [*sorted((HERE / "testapp").glob("*.go")), HERE / "testapp" / "go.mod"]
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=readonly"}

    def build(out: Path) -> None:
        done = subprocess.run(
            [
                go,
                "build",
                "-trimpath",
                "-buildvcs=false",
                "-ldflags=-s -w -buildid=",
                "-o",
                str(out),
                ".",
            ],
            cwd=HERE / "testapp",
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise BuildError(f"go build of packaging/image/testapp failed: {done.stderr.strip()}")

    return compiled("meshtest", sources, _tool_version([go, "version"]), build)


def pause_image() -> oci.Image:
    program = pause_program()
    return oci.Image(
        repository=PAUSE_REPOSITORY,
        tag=__version__,
        layers=(oci.Layer("pause.c, gcc -static", (oci.file_from("/pause", program, 0o755),)),),
        entrypoint=("/pause",),
        user="65535:65535",
        labels=labels(
            "meshctl-pause", "The pod sandbox process: waits for signals, reaps children."
        ),
    )


def testapp_image() -> oci.Image:
    program = testapp_program()
    busybox = Path("/bin/busybox")
    try:
        version = rootfs.version("busybox-static")
    except rootfs.RootfsError as exc:
        raise BuildError(f"{exc} (the test image's shell tools)") from exc
    applets = subprocess.run(
        [str(busybox), "--list-full"], capture_output=True, text=True, check=True
    ).stdout.split()
    entries = [oci.file_from("/bin/busybox", busybox.resolve(), 0o755)]
    entries += [
        oci.symlink(f"/{applet}", "/bin/busybox")
        for applet in applets
        if applet != "bin/busybox" and applet.startswith(("bin/", "sbin/", "usr/"))
    ]
    entries += [
        oci.file_from("/usr/local/bin/meshtest", program, 0o755),
        oci.file_bytes(
            "/etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        ),
        oci.file_bytes("/etc/group", b"root:x:0:\nnogroup:x:65534:\n"),
        oci.directory("/tmp", 0o1777),  # noqa: S108 (the image's own /tmp, sticky as usual)
    ]
    return oci.Image(
        repository=TESTAPP_REPOSITORY,
        tag=__version__,
        layers=(oci.Layer(f"meshtest (Go, static) + busybox-static {version}", tuple(entries)),),
        entrypoint=("/usr/local/bin/meshtest",),
        cmd=("serve",),
        env=("PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",),
        user="65534:65534",
        labels=labels(
            "meshctl-testapp", "meshctl's test workload: HTTP/TCP/gRPC-health server and client."
        ),
    )


# --- the Gateway API conformance suite's images: programs tests/kube/build.sh built ------------


def test_cache() -> Path:
    """Where tests/kube/build.sh caches what it builds (its ``cache_root``)."""
    configured = os.environ.get("MESHCTL_TEST_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "meshctl-test"


def pinned(wrapper: str, module: str) -> str:
    """The version of ``module`` a wrapper module under tests/kube pins (build.sh reads it so)."""
    go_mod = ROOT / "tests" / "kube" / wrapper / "go.mod"
    for line in go_mod.read_text().splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in (module, "require") and module in words:
            version = words[words.index(module) + 1]
            if version.startswith("v"):
                return version
    raise BuildError(f"{go_mod} pins no {module}")


def _built(path: Path) -> Path:
    if not path.exists():
        raise BuildError(f"{path} not found: run 'bash tests/kube/build.sh' first")
    return path


def suite_refs(repository: str) -> tuple[str, ...]:
    """The references of ``repository`` the conformance suite's manifests use, newest tag last."""
    version = pinned("gateway-api", "sigs.k8s.io/gateway-api/conformance")
    listed = _built(test_cache() / "gateway-api" / version / "image-refs").read_text().split()
    refs = sorted(r for r in listed if r.rpartition(":")[0] == repository)
    if not refs:
        raise BuildError(f"the conformance suite {version} names no {repository} image")
    return tuple(refs)


def static_program_image(
    refs: tuple[str, ...], program: Path, path: str, title: str, source: str
) -> oci.Image:
    """One static program at ``path``, run as distroless's nonroot user as upstream's image is.

    (Upstream's CoreDNS binary carries the file capability to bind port 53; ours needs none: the
    test node's containerd sets ``enable_unprivileged_ports``, which opens every port to any uid.)
    """
    repository, _, tag = refs[0].rpartition(":")
    entries = (
        oci.file_from(path, program, 0o755),
        oci.file_bytes(
            "/etc/passwd",
            b"root:x:0:0:root:/root:/sbin/nologin\n"
            b"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
        ),
        oci.file_bytes("/etc/group", b"root:x:0:\nnonroot:x:65532:\n"),
        oci.directory("/home/nonroot", 0o700),
        oci.directory("/tmp", 0o1777),  # noqa: S108 (the image's own /tmp, sticky as usual)
    )
    return oci.Image(
        repository=repository,
        tag=tag,
        aliases=refs[1:],
        layers=(oci.Layer(f"{source}, CGO_ENABLED=0", entries),),
        entrypoint=(path,),
        env=("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",),
        user="65532:65532",
        labels={
            "org.opencontainers.image.title": title,
            "org.opencontainers.image.description": f"Built from {source} for meshctl's tests.",
            "org.opencontainers.image.licenses": "Apache-2.0",
        },
    )


def echo_basic_image() -> oci.Image:
    version = pinned("gateway-api", "sigs.k8s.io/gateway-api/conformance")
    program = _built(test_cache() / "gateway-api" / version / "echo-basic")
    refs = suite_refs("registry.k8s.io/gateway-api/echo-basic")
    source = f"sigs.k8s.io/gateway-api/conformance/echo-basic {version}"
    return static_program_image(refs, program, "/echo-basic", "echo-basic", source)


def coredns_image() -> oci.Image:
    version = pinned("coredns", "github.com/coredns/coredns")
    program = _built(test_cache() / "coredns" / version / "coredns")
    refs = suite_refs("registry.k8s.io/coredns/coredns")
    if refs != (f"registry.k8s.io/coredns/coredns:{version}",):
        raise BuildError(f"the suite runs {', '.join(refs)}; tests/kube/coredns pins {version}")
    source = f"github.com/coredns/coredns {version}"
    return static_program_image(refs, program, "/coredns", "coredns", source)


def istio_module_version() -> str:
    """The version of the Istio module tests/harness/istio.py pins (build.sh reads it so)."""
    pin = ROOT / "tests" / "harness" / "istio.py"
    for line in pin.read_text().splitlines():
        if line.startswith('ISTIO_MODULE = "'):
            return line.split('"')[1].partition("@")[2]
    raise BuildError(f"{pin} pins no ISTIO_MODULE")


def istio_cni_image() -> oci.Image:
    """Istio's CNI agent as the istio-cni chart runs it: ``install-cni`` on PATH, the plugin at
    /opt/cni/bin (what it copies to the node), iptables for the rules it writes in each pod."""
    version = istio_module_version()
    built = test_cache() / "istio-cni" / version
    if not (built / "install-cni").is_file() or not (built / "istio-cni").is_file():
        raise BuildError(
            f"{built} has no install-cni/istio-cni: run 'bash tests/kube/build.sh --istio-cni'"
        )
    packages = rootfs.closure(rootfs.ROOTS)
    base = rootfs.entries(packages)
    base += rootfs.alternatives({e.path for e in base}) + rootfs.system_files()
    listed = ", ".join(f"{p.name}={p.version}" for p in packages)
    source = f"istio.io/istio {version} ./cni/cmd/install-cni ./cni/cmd/istio-cni, CGO_ENABLED=0"
    app = (
        oci.file_from("/usr/local/bin/install-cni", built / "install-cni", 0o755),
        oci.file_from("/opt/cni/bin/istio-cni", built / "istio-cni", 0o755),
        # The agent finds the node's netns as /host/proc/1/ns/net (the chart mounts the node's
        # /proc there). The test machine's pid 1 lets no one read that link, so the image points
        # /host/proc at the container's own /proc, whose pid 1 is the agent itself: in a
        # hostNetwork pod, in the node's netns.
        oci.directory("/host"),
        oci.symlink("/host/proc", "/proc"),
    )
    return oci.Image(
        repository="localhost/istio-install-cni",
        tag=version,
        layers=(oci.Layer(f"debian files: {listed}", tuple(base)), oci.Layer(source, app)),
        entrypoint=("/usr/local/bin/install-cni",),
        env=("PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",),
        labels={
            "org.opencontainers.image.title": "istio-install-cni",
            "org.opencontainers.image.description": f"Built from {source} for meshctl's tests.",
            "org.opencontainers.image.licenses": "Apache-2.0",
        },
    )


IMAGES: dict[str, Callable[[Path], oci.Image]] = {
    "meshctl": meshctl_image,
    "pause": lambda _tree: pause_image(),
    "testapp": lambda _tree: testapp_image(),
    "echo-basic": lambda _tree: echo_basic_image(),
    "coredns": lambda _tree: coredns_image(),
    "istio-cni": lambda _tree: istio_cni_image(),
}
# Built only when named: the one node test that runs Istio's agent asks for it (its binaries come
# from tests/kube/build.sh --istio-cni, which that test runs on demand).
ON_REQUEST = frozenset({"istio-cni"})


def default_names() -> list[str]:
    """What ``build.py`` builds when no NAME is given."""
    return [n for n in IMAGES if n not in ON_REQUEST]


# --- the cache and the CLI -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Result:
    name: str
    written: oci.Written
    file: Path
    cached: bool


def writer_source() -> bytes:
    """The code the tarballs are made by: the product's writer and recipe, and this script."""
    writers = (
        ROOT / "meshctl" / "core" / "image" / "layout.py",
        ROOT / "meshctl" / "image" / "oci.py",
        ROOT / "meshctl" / "image" / "rootfs.py",
        ROOT / "meshctl" / "image" / "product.py",
        Path(__file__),
    )
    return b"".join(p.read_bytes() for p in writers)


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another checkout may build the same image right now
        yield


def build(name: str, image: oci.Image, out: Path, *, use_cache: bool) -> Result:
    """``out/<name>.tar`` for ``image``: from the cache when its recipe is there, else written."""
    cache = cache_root() / "images"
    key = oci.recipe(image, writer_source())
    cached_tar = cache / f"{name}-{key[:24]}.tar"
    cached_info = cached_tar.with_suffix(".json")
    target = out / f"{name}.tar"
    with locked(cache):
        hit = use_cache and cached_tar.is_file() and cached_info.is_file()
        if hit:
            written = oci.Written(**json.loads(cached_info.read_text()))
            os.utime(cached_tar)  # most recently used: kept by the pruning below
        else:
            written = oci.write_archive(image, cached_tar if use_cache else target)
            if use_cache:
                cached_info.write_text(json.dumps(dataclasses.asdict(written)))
                _prune(cache, name)
        if use_cache:
            tmp = target.with_name(f".{target.name}.{os.getpid()}")
            shutil.copyfile(cached_tar, tmp)
            tmp.replace(target)
    return Result(name, written, target, hit)


def _prune(cache: Path, name: str) -> None:
    tarballs = sorted(cache.glob(f"{name}-*.tar"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in tarballs[KEEP_PER_IMAGE:]:
        old.unlink(missing_ok=True)
        old.with_suffix(".json").unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="directory for the tarballs")
    parser.add_argument("--tree", type=Path, default=ROOT / "dist" / "meshctl-tree")
    parser.add_argument("--no-cache", action="store_true", help="write every tarball afresh")
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"any of {', '.join(IMAGES)}")
    args = parser.parse_args(argv)
    names = args.names or default_names()
    unknown = [n for n in names if n not in IMAGES]
    if unknown:
        parser.error(f"unknown image {unknown[0]!r}: choose from {', '.join(IMAGES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    index_path = args.out / "images.json"
    try:
        index = json.loads(index_path.read_text()) if index_path.is_file() else {}
    except ValueError:
        index = {}
    try:
        for name in names:
            result = build(
                name, IMAGES[name](args.tree.resolve()), args.out, use_cache=not args.no_cache
            )
            index[name] = {**dataclasses.asdict(result.written), "file": result.file.name}
            how = "cached" if result.cached else "built"
            print(
                f"{result.written.ref} {result.written.digest} "
                f"{result.written.size / 2**20:.1f} MiB {how} -> {result.file}"
            )
    except (BuildError, rootfs.RootfsError) as exc:
        print(f"build.py: {exc}", file=sys.stderr)
        return 1
    tmp = index_path.with_name(f".{index_path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    tmp.replace(index_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
