"""Fetch the Gateway API standard-channel CRDs that install ships, into a git-ignored data dir.

The CRDs are upstream's (``sigs.k8s.io/gateway-api``, ``config/crd/standard``), never written or
copied into the repository: this script downloads the pinned module zip from the Go module proxy
(``$GOPROXY``'s first proxy, else proxy.golang.org) into a cache outside the repo, checks its
pinned SHA-256, and extracts the CRD YAML files into ``plugins/controlplane/gateway_api_crds/``
(git-ignored; package data of ``pip install .`` and of the frozen build, which run it first).
The version is the one the conformance suite in tests/kube/gateway-api expects.

Usage: python packaging/gateway_api.py [--check]   (--check: fail unless the data is current)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE = "sigs.k8s.io/gateway-api"
VERSION = "v1.6.3"
SHA256 = "7c5d0a931d6ffb3e08ac4d5318969faaa6acf25a40ad13cc5978c22117e9b64b"
PREFIX = f"{MODULE}@{VERSION}/config/crd/standard/"
DATA = ROOT / "plugins" / "controlplane" / "gateway_api_crds"
STAMP = "VERSION"


def proxy() -> str:
    for raw in os.environ.get("GOPROXY", "").replace("|", ",").split(","):
        entry = raw.strip()
        if entry and entry not in ("direct", "off"):
            return entry.rstrip("/")
    return "https://proxy.golang.org"


def cached_zip() -> bytes:
    cache = Path(os.environ.get("MESHCTL_BUILD_CACHE", Path.home() / ".cache" / "meshctl-build"))
    path = cache / "gateway-api" / f"{VERSION}.zip"
    if path.exists():
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() == SHA256:
            return data
    url = f"{proxy()}/{MODULE}/@v/{VERSION}.zip"
    with urllib.request.urlopen(url, timeout=120) as response:  # noqa: S310 (https proxy URL)
        data = response.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256:
        raise SystemExit(f"{url}: SHA-256 {digest}, pinned {SHA256}: refusing it")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def crd_files(data: bytes) -> dict[str, bytes]:
    """The standard channel's CRD files (not its admission policy), by file name."""
    out = {}
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        for name in archive.namelist():
            base = name.removeprefix(PREFIX)
            wanted = base.endswith(".yaml") and "/" not in base and "_vap_" not in base
            if name.startswith(PREFIX) and wanted:
                out[base] = archive.read(name)
    if not out:
        raise SystemExit(f"{MODULE}@{VERSION}: no CRDs under {PREFIX}")
    return out


def current() -> bool:
    stamp = DATA / STAMP
    return stamp.exists() and stamp.read_text().strip() == f"{VERSION} {SHA256}"


def fill() -> int:
    files = crd_files(cached_zip())
    with tempfile.TemporaryDirectory(dir=DATA.parent) as tmp:
        staged = Path(tmp) / "crds"
        staged.mkdir()
        for name, body in sorted(files.items()):
            (staged / name).write_bytes(body)
        (staged / STAMP).write_text(f"{VERSION} {SHA256}\n")
        if DATA.exists():
            shutil.rmtree(DATA)
        staged.rename(DATA)
    return len(files)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail unless the data is current")
    args = parser.parse_args()
    if args.check:
        if current():
            print(f"Gateway API {VERSION} CRDs are current in {DATA.relative_to(ROOT)}")
            return 0
        print(f"Gateway API {VERSION} CRDs missing or stale: python packaging/gateway_api.py")
        return 1
    count = fill()
    print(f"wrote {count} Gateway API {VERSION} CRD files to {DATA.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
