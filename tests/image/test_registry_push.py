"""``meshctl image push`` against a real registry (Debian's docker-registry, the CNCF distribution
server, started on loopback per test): plain HTTP, TLS with htpasswd basic auth, and token auth;
each push is read back from the registry and its digest compared with the archive's."""

from __future__ import annotations

import base64
import hashlib
import json
import ssl
import urllib.request
from pathlib import Path

import pytest

from meshctl.image import oci
from tests.harness.cli import run_meshctl
from tests.harness.registry import Registry, start_registry

pytestmark = pytest.mark.packaging

MANIFEST_TYPES = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture
def archive(tmp_path: Path) -> tuple[Path, str]:
    """A small image tarball written by the product's writer, and its manifest digest."""
    program = tmp_path / "prog"
    program.write_bytes(b"#!/bin/sh\necho hello\n" + bytes(range(256)) * 64)
    program.chmod(0o755)
    image = oci.Image(
        repository="localhost/small",
        tag="1",
        layers=(
            oci.Layer("one", (oci.file_from("/prog", program), oci.directory("/tmp", 0o1777))),
            oci.Layer("two", (oci.file_bytes("/etc/motd", b"hi\n"),)),
        ),
        entrypoint=("/prog",),
    )
    written = oci.write_archive(image, tmp_path / "small.tar")
    return tmp_path / "small.tar", written.digest


def _get_manifest(
    registry: Registry, repository: str, tag: str, token: str = ""
) -> tuple[str, bytes]:
    """The registry's manifest for the tag, read with the standard library (not meshctl's client):
    the digest header and the bytes."""
    request = urllib.request.Request(  # noqa: S310 (an http(s) URL we built)
        f"{registry.base}/v2/{repository}/manifests/{tag}", headers={"Accept": MANIFEST_TYPES}
    )
    if token:
        request.add_header("Authorization", token)
    context = ssl.create_default_context(cafile=str(registry.ca_file)) if registry.tls else None
    with urllib.request.urlopen(request, timeout=10, context=context) as answer:  # noqa: S310
        return answer.headers["Docker-Content-Digest"], answer.read()


def _push(*args: str, stdin: str | None = None, env: dict[str, str] | None = None):
    return run_meshctl("image", "push", *args, "-o", "json", stdin=stdin, env=env)


def test_a_push_over_plain_http_is_served_back_under_the_archives_digest(archive, tmp_path):
    path, digest = archive
    with start_registry(tmp_path / "registry") as registry:
        pushed = _push(f"{registry.host}/team/small:1.0", "--from", str(path), "--insecure")
        assert pushed.returncode == 0, pushed.stderr
        answer = json.loads(pushed.stdout)
        assert answer["digest"] == digest
        assert len(answer["uploaded"]) == 3  # two layers, the config
        assert answer["skipped"] == []
        served, body = _get_manifest(registry, "team/small", "1.0")
        assert served == digest == "sha256:" + hashlib.sha256(body).hexdigest()
        assert "install --set image=" + f"{registry.host}/team/small:1.0" in pushed.stderr

        again = _push(f"{registry.host}/team/small:1.1", "--from", str(path), "--insecure")
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["uploaded"] == []  # HEAD found every blob: none sent
        assert len(json.loads(again.stdout)["skipped"]) == 3
        assert _get_manifest(registry, "team/small", "1.1")[0] == digest


def test_tls_with_basic_auth_needs_the_ca_and_the_password(archive, tmp_path):
    path, digest = archive
    users = {"alice": "s3cret-pw"}
    with start_registry(tmp_path / "registry", tls=True, auth="htpasswd", users=users) as registry:
        ref = f"{registry.host}/small:2"
        untrusted = _push(
            ref, "--from", str(path), "-u", "alice", "--password-stdin", stdin="s3cret-pw\n"
        )
        assert untrusted.returncode == 1
        assert untrusted.stderr.startswith("Error: TLS with 127.0.0.1")
        assert "Hint: pass --ca-file FILE" in untrusted.stderr
        ca = ("--ca-file", str(registry.ca_file))
        anonymous = _push(ref, "--from", str(path), *ca, env={"DOCKER_CONFIG": str(tmp_path)})
        assert anonymous.returncode == 1
        assert "UNAUTHORIZED" in anonymous.stderr.splitlines()[0]
        wrong = _push(
            ref, "--from", str(path), *ca, "-u", "alice", "--password-stdin", stdin="nope\n"
        )
        assert wrong.returncode == 1
        first = wrong.stderr.splitlines()[0]
        assert first.startswith(f"Error: {registry.host} refused access to its API: UNAUTHORIZED")
        assert "nope" not in wrong.stderr
        assert "s3cret" not in wrong.stderr
        assert "Hint: log in: --username USER --password-stdin" in wrong.stderr
        good = _push(
            ref, "--from", str(path), *ca, "-u", "alice", "--password-stdin", stdin="s3cret-pw\n"
        )
        assert good.returncode == 0, good.stderr
        assert json.loads(good.stdout)["digest"] == digest
        basic = "Basic " + base64.b64encode(b"alice:s3cret-pw").decode()
        assert _get_manifest(registry, "small", "2", basic)[0] == digest


def test_token_auth_takes_the_docker_configs_credentials_and_names_a_refusal(archive, tmp_path):
    path, digest = archive
    users = {"bob": "token-pw", "reader": "read-pw"}
    requests: list[str] = []
    config = tmp_path / "docker"
    config.mkdir()
    with start_registry(
        tmp_path / "registry",
        tls=True,
        auth="token",
        users=users,
        pull_only=frozenset({"reader"}),
        token_requests=requests,
    ) as registry:
        auths = {registry.host: {"auth": base64.b64encode(b"bob:token-pw").decode()}}
        (config / "config.json").write_text(json.dumps({"auths": auths}))
        ref = f"{registry.host}/mesh/small:3"
        ca = ("--ca-file", str(registry.ca_file))
        pushed = _push(ref, "--from", str(path), *ca, env={"DOCKER_CONFIG": str(config)})
        assert pushed.returncode == 0, pushed.stderr
        assert json.loads(pushed.stdout)["digest"] == digest
        assert any("scope=repository%3Amesh%2Fsmall%3Apull%2Cpush" in r for r in requests), requests

        refused = _push(
            f"{registry.host}/mesh/other:1", "--from", str(path), *ca, "-u", "reader",
            "--password-stdin", stdin="read-pw",
        )  # fmt: skip
        assert refused.returncode == 1
        lines = [line for line in refused.stderr.splitlines() if ": pushing " not in line]
        assert lines[0].startswith(f"Error: {registry.host} refused an upload of blob sha256:")
        assert "UNAUTHORIZED" in lines[0]
        assert lines[1].startswith("Hint: ")
        assert len(lines) == 2  # one line, one hint: no traceback
