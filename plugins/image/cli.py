"""``meshctl image build`` writes the OCI image of the running meshctl as one tarball;
``meshctl image push`` sends a tarball (or a fresh build) to a registry over the distribution API.

The tarball is an OCI image layout that is also a ``docker save`` archive (meshctl/image/oci.py):
``ctr images import``, ``docker load`` and ``podman load`` take it, and the same build gives the
same bytes. ``-o`` is the output format of the summary, as on every command; the tarball's path
is ``--archive``.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from meshctl import __version__, options
from meshctl.errors import UserError
from meshctl.output import OutputFormat, render

app = options.command_app(
    help="The meshctl image: build it from this binary (daemonless), push it to a registry.",
    no_args_is_help=True,
)


class ExistingDirectory:
    """A path that must name a directory (a frozen one-dir tree)."""

    __slots__ = ()
    metavar = "DIR"

    def __call__(self, raw: Any) -> Path:
        path = Path(raw).expanduser()
        if not path.is_dir():
            raise ValueError(f"{str(raw)!r} is not a directory")
        return path


class ImageReference:
    """``[REGISTRY/]REPOSITORY[:TAG]`` (the distribution project's grammar)."""

    __slots__ = ()
    metavar = "IMAGE"

    def __call__(self, raw: Any) -> Any:
        from meshctl.core.image.distribution import Reference, parse_reference

        if isinstance(raw, Reference):
            return raw
        return parse_reference(str(raw))


TreeOption = Annotated[
    Path | None,
    options.option(
        "--tree",
        parse=ExistingDirectory(),
        help="Build from this frozen one-dir tree (dist/meshctl-tree) instead of this binary.",
        show_default=False,
    ),
]


def _archive_default() -> Path:
    return Path(f"meshctl-{__version__}.tar")


def _build(tree: Path | None, archive: Path) -> dict[str, Any]:
    from meshctl.image import product

    if tree is not None:
        source = product.Source("tree", tree.resolve())
    else:
        found = product.own_source()
        if found is None:
            _say(
                "meshctl runs unfrozen: freezing this checkout first (packaging/build.sh, minutes)"
            )
            found = product.freeze()
        source = found
    image = product.build(source)
    written = product.write(image, archive)
    return {
        "ref": written.ref,
        "digest": written.digest,
        "config": written.config,
        "size": written.size,
        "file": str(archive),
        "source": f"{source.kind} {source.path}",
    }


@app.command("build")
def build(
    output: options.OutputOption = OutputFormat.TABLE,
    output_file: options.OutputFileOption = None,
    archive: Annotated[
        Path | None,
        options.option(
            "--archive",
            parse=options.OutputFile(),
            help="Write the image tarball to FILE (default: meshctl-<version>.tar here).",
            show_default=False,
        ),
    ] = None,
    tree: TreeOption = None,
) -> None:
    """Write the OCI image of this meshctl (frozen: itself; from a venv: frozen first)."""
    target = archive or _archive_default()
    data = _build(tree, target)
    names = [f"{data['ref']}@{data['digest']}"]
    options.write_output(render(data, output, names=names), output_file)


def _credentials(reference: Any, username: str | None, password_stdin: bool) -> Any:
    from meshctl.core.image.distribution import Credentials
    from meshctl.image.registry import docker_config, stored_credentials

    if password_stdin and not username:
        raise UserError("--password-stdin needs --username", hint="add --username USER")
    if username:
        password = ""
        if password_stdin:
            password = sys.stdin.read().rstrip("\r\n")
            if not password:
                raise UserError(
                    "no password on stdin", hint='echo "$TOKEN" | meshctl image push ...'
                )
        return Credentials(username, password)
    found, helper = stored_credentials(reference, docker_config())
    if found is None and helper:
        typer.echo(
            f"note: the docker config keeps {reference.registry}'s credentials in the "
            f"docker-credential-{helper} helper, which meshctl does not run; "
            "pass --username and --password-stdin if the registry asks",
            err=True,
        )
    return found


@app.command("push")
def push(
    reference: Annotated[
        Any,
        typer.Argument(
            metavar="IMAGE",
            parser=options.typed(ImageReference()),
            help="Where to push: REGISTRY/REPOSITORY:TAG (e.g. registry.example/mesh/meshctl:1.0).",
            show_default=False,
        ),
    ],
    output: options.OutputOption = OutputFormat.TABLE,
    output_file: options.OutputFileOption = None,
    source: Annotated[
        Path | None,
        options.existing_file(
            "--from",
            help="Push this image tarball (meshctl image build --archive); default: build now.",
            show_default=False,
        ),
    ] = None,
    tree: TreeOption = None,
    username: Annotated[
        str | None,
        typer.Option(
            "--username",
            "-u",
            metavar="USER",
            help="Registry user (default: the docker config's auths entry for the registry).",
        ),
    ] = None,
    password_stdin: Annotated[
        bool, typer.Option("--password-stdin", help="Read the password or token from stdin.")
    ] = False,
    ca_file: Annotated[
        Path | None,
        options.existing_file(
            "--ca-file", help="Trust this CA bundle (PEM) for the registry's TLS certificate."
        ),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option("--insecure", help="Plain HTTP, no TLS (a registry on localhost)."),
    ] = False,
    dry_run: options.DryRunOption = False,
) -> None:
    """Push the meshctl image to a registry (OCI distribution API: basic or token auth)."""
    from meshctl.image import oci
    from meshctl.image.registry import Settings
    from meshctl.image.registry import push as push_image

    if insecure and ca_file is not None:
        raise UserError(
            "--insecure is plain HTTP: no TLS to check", hint="drop --ca-file or --insecure"
        )
    if source is not None and tree is not None:
        raise UserError("--from pushes a built tarball, --tree builds one", hint="give one of them")
    with (
        tempfile.TemporaryDirectory(prefix="meshctl-image-") as work,
        contextlib.ExitStack() as stack,
    ):
        if source is None:
            source = Path(work, "image.tar")
            _build(tree, source)
        try:
            layout = stack.enter_context(oci.open_layout(source))
        except ValueError as exc:
            raise UserError(f"{exc}", hint="give a tarball meshctl image build wrote") from exc
        if dry_run:
            parsed = layout.parsed
            blobs = [*parsed.layers, parsed.config]
            data: dict[str, Any] = {
                "reference": str(reference),
                "digest": parsed.manifest.digest,
                "blobs": [b.digest for b in blobs],
                "bytes": sum(b.size for b in blobs) + len(layout.manifest_bytes),
                "dryRun": True,
            }
        else:
            settings = Settings(
                insecure=insecure,
                ca_file=ca_file,
                credentials=_credentials(reference, username, password_stdin),
            )
            pushed = push_image(layout, reference, settings, say=_say)
            data = {
                "reference": pushed.reference,
                "digest": pushed.digest,
                "uploaded": list(pushed.uploaded),
                "skipped": list(pushed.skipped),
                "bytes": pushed.size,
            }
    names = [f"{data['reference']}@{data['digest']}"]
    options.write_output(render(data, output, names=names), output_file)
    if not dry_run:
        _say(f"install it with: meshctl install --set image={data['reference']}")


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()
