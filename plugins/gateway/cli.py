"""``meshctl gateway run`` (the ingress proxy), ``meshctl gateway routes`` (its route table) and
``meshctl gateway explain URL`` (which listener, route and backend a request takes, or why none)."""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Annotated, Any

import typer

from meshctl import config, options, rundir, values
from meshctl.errors import UserError
from meshctl.output import OutputFormat

from .settings import GatewaySettings

if TYPE_CHECKING:
    from meshctl.core.gateway.config import GatewayConfig

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    no_args_is_help=True,
)
log = logging.getLogger(__name__)


def _setting(field: str, help: str, metavar: str | None = None) -> Any:  # noqa: A002
    """``meshctl gateway run``'s option for ``GatewaySettings.<field>``."""
    return options.from_setting(GatewaySettings, field, help=help, metavar=metavar)


@app.command()
def run(
    ctx: typer.Context,
    gateway: Annotated[
        str | None,
        _setting(
            "gateway",
            "The Gateway served (NAMESPACE/NAME), or 'ingress' for the Ingress proxy "
            "[default: the only Gateway in -f, else ingress].",
            metavar="NAMESPACE/NAME",
        ),
    ] = None,
    # Not --config: that is the root's settings file, a global flag taken from anywhere.
    config_files: Annotated[
        list[str] | None,
        options.filename(
            "Standalone: Kubernetes objects (Gateway, HTTPRoute, Ingress, Service, "
            "EndpointSlice, Secret ...) to serve, re-read when they change; a directory is its "
            ".yaml/.yml/.json files; repeatable."
        ),
    ] = None,
    xds_address: Annotated[
        str | None,
        _setting("xds_address", "Control plane to take the config from.", metavar="HOST:PORT"),
    ] = None,
    ca_address: Annotated[
        str | None,
        _setting("ca_address", "Mesh CA for the gateway's identity.", metavar="HOST:PORT"),
    ] = None,
    bind_address: Annotated[
        str | None,
        _setting("bind_address", "Address the listeners bind (0.0.0.0).", metavar="ADDRESS"),
    ] = None,
    port_offset: Annotated[
        int | None,
        _setting("port_offset", "Added to every port bound (tests on loopback) (0).", "N"),
    ] = None,
    drain_deadline: Annotated[
        float | None, _setting("drain_deadline", "How long requests in flight may finish (5s).")
    ] = None,
    header_timeout: Annotated[
        float | None,
        _setting("header_timeout", "How long a client may take to send a request head (10s)."),
    ] = None,
    max_request_body: Annotated[
        int | None,
        _setting(
            "max_request_body", "Larger request bodies (Content-Length) get 413 (0: none).", "BYTES"
        ),
    ] = None,
    idle_timeout: Annotated[
        float | None,
        _setting("idle_timeout", "Idle connections (HTTP keep-alive, TLS, TCP) close after (60s)."),
    ] = None,
    reload_interval: Annotated[
        float | None, _setting("reload_interval", "How often -f files are checked (1s).")
    ] = None,
    workers: Annotated[
        int | None,
        _setting("workers", "Worker processes sharing the listener ports (1: one process).", "N"),
    ] = None,
    run_dir: Annotated[
        str | None,
        _setting(
            "run_dir",
            rundir.option_help("gateway"),
            metavar="DIR",
        ),
    ] = None,
    channel_fd: Annotated[int | None, typer.Option(hidden=True)] = None,
) -> None:
    """Run the ingress gateway: serve the listeners and routes of a Gateway (or the Ingresses)."""
    flags = {k: v for k, v in locals().items() if k not in ("ctx", "config_files", "channel_fd")}
    level = options.daemon_logging(ctx)
    if channel_fd is not None:  # a worker of 'gateway run --workers N', fed by its supervisor
        from .worker import run as run_worker

        raise typer.Exit(run_worker(channel_fd))
    settings = config.resolve(GatewaySettings, flags=flags)
    files = tuple(options.source_names(config_files or ()))
    if "-" in files:
        raise UserError("-f -: the gateway re-reads its files", hint="name a file or directory")
    settings = dataclasses.replace(settings, config=files)
    if not settings.config and not settings.xds_address:
        raise UserError(
            "no configuration source",
            hint="pass -f FILE (Kubernetes objects), or --xds-address (XDS_ADDRESS) and "
            "--gateway NAMESPACE/NAME for the control plane's",
        )
    from .process import serve

    log_args = ("--log-level", level, "--log-format", ctx.obj.log_format)
    code = serve(settings, log_args)
    if code:
        raise typer.Exit(code)


def _which(namespace: str | None, name: str | None) -> str:
    if name in (None, "", "ingress"):
        return name or ""
    return f"{namespace or 'default'}/{name}"


def _rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The route table as one row per (port, listener, host, match), in precedence order."""
    rows = []
    for port in data.get("ports") or ():
        for listener in port["listeners"]:
            for host in listener["hosts"]:
                for route in host["routes"]:
                    rows.append(
                        {
                            "port": f"{port['port']}/{port['protocol']}",
                            "listener": listener["listener"],
                            "host": host["hostname"],
                            "match": route.get("match", "-"),  # a TLSRoute: none
                            "route": route["route"],
                            "backends": route["backends"] or ["(none: 500)"],
                        }
                    )
        if "default" in port:
            default = port["default"]
            rows.append(
                {
                    "port": f"{port['port']}/{port['protocol']}",
                    "listener": "(default backend)",
                    "host": "*",
                    "match": default["match"],
                    "route": default["route"],
                    "backends": default["backends"],
                }
            )
    return rows


@app.command()
def routes(
    name: Annotated[
        str | None,
        typer.Argument(metavar="NAME", help="The Gateway (or 'ingress'); default: the only one."),
    ] = None,
    namespace: Annotated[str | None, options.namespace("The Gateway's namespace.")] = None,
    filename: options.FilenameOption = None,
    admin: Annotated[
        str,
        options.option(
            "--admin",
            parse=values.DIAL_ADDRESS,
            help="A running gateway's admin port (without -f).",
        ),
    ] = "127.0.0.1:15000",
    output: options.OutputOption = OutputFormat.TABLE,
    output_file: options.OutputFileOption = None,
) -> None:
    """Print the route table a gateway serves: from -f files, or from a running gateway."""
    from meshctl import output as out

    if filename:
        from meshctl.core.gateway import render

        from .sources import load

        names = tuple(s for s in options.source_names(filename))
        local = load(names, _which(namespace, name))
        data = {"gateway": local.config.name, **render.table_data(local.config.table)}
    else:
        data = _admin_dump(admin)
    rows = _rows(data.get("routes") or data)
    if not rows and output is OutputFormat.TABLE:
        typer.echo(f"{data.get('gateway') or 'gateway'}: no routes", err=True)
        return
    options.write_output(out.render(data, output, table=rows), output_file)


def _admin_dump(admin: str) -> dict[str, Any]:
    import http.client
    import json

    host, _, port = admin.rpartition(":")
    try:
        conn = http.client.HTTPConnection(host or "127.0.0.1", int(port), timeout=5)
        conn.request("GET", "/config_dump")
        response = conn.getresponse()
        body = response.read()
    except (OSError, ValueError) as exc:
        raise UserError(
            f"no gateway answers at {admin}: {getattr(exc, 'strerror', None) or exc}",
            hint="run it on this host (meshctl gateway run), pass --admin, or -f FILE",
        ) from exc
    if response.status != 200:
        raise UserError(f"{admin}/config_dump answered {response.status}")
    data: dict[str, Any] = json.loads(body)
    return data


@app.command()
def explain(
    url: Annotated[
        str,
        typer.Argument(
            metavar="URL",
            help="e.g. https://example.com/api?x=1; grpc://HOST/pkg.Service/Method (grpcs:// "
            "over TLS) for a gRPC call; tls://NAME:PORT for a TLS passthrough connection with "
            "that SNI (tls://:PORT: none), tcp://:PORT for a TCP listener.",
        ),
    ],
    filename: options.FilenameOption = None,
    name: Annotated[
        str | None,
        _setting("gateway", "The Gateway (or 'ingress').", metavar="NAMESPACE/NAME"),
    ] = None,
    method: Annotated[
        str, typer.Option("-X", "--method", metavar="METHOD", help="The request's method.")
    ] = "GET",
    header: Annotated[
        list[str] | None,
        typer.Option("-H", "--header", metavar="NAME:VALUE", help="A request header; repeatable."),
    ] = None,
    output: options.OutputOption = OutputFormat.YAML,
    output_file: options.OutputFileOption = None,
) -> None:
    """Say which listener, route, rule and backend a request for URL takes, or why none."""
    from urllib.parse import urlsplit

    from meshctl import output as out
    from meshctl.core.gateway import grpc, render
    from meshctl.core.gateway.matching import Request, match

    from .sources import load

    if not filename:
        raise UserError("explain needs the configuration", hint="pass -f FILE (the objects)")
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme in ("https", "tls", "grpcs") else 80)
    except ValueError as exc:  # "http://[::1", a port out of range
        raise UserError(
            f"{url!r} is not a URL: {exc}", hint="e.g. http://example.com/path"
        ) from exc
    gateway = config.resolve(GatewaySettings, flags={"gateway": name}).gateway
    if parts.scheme in ("tls", "tcp"):
        if parts.scheme == "tcp" and not parts.port:
            raise UserError(f"{url!r} names no port", hint="e.g. tcp://:31400")
        local = load(tuple(options.source_names(filename)), gateway)
        data = _explain_stream(local.config, parts.scheme, parts.hostname or "", port)
        options.write_output(out.render({"request": url, **data}, output), output_file)
        return
    if parts.scheme not in ("http", "https", *_GRPC_SCHEMES) or not parts.hostname:
        raise UserError(
            f"{url!r} is not an http(s) URL",
            hint="e.g. http://example.com/path, grpc://example.com/pkg.Service/Method, "
            "tls://example.com:443 or tcp://:31400",
        )
    call = parts.scheme in _GRPC_SCHEMES
    scheme = _GRPC_SCHEMES.get(parts.scheme, parts.scheme)
    headers = []
    for item in header or ():
        hname, colon, value = item.partition(":")
        if not colon:
            raise UserError(f"-H {item!r}: write NAME:VALUE")
        headers.append((hname.strip().lower(), value.strip()))
    if call:  # what a gRPC client sends: POST over HTTP/2 with gRPC's content-type
        headers.append(("content-type", grpc.CONTENT_TYPE))
    local = load(tuple(options.source_names(filename)), gateway)
    request = Request(
        port=port,
        host=parts.netloc.rpartition("@")[2],
        path=parts.path or "/",
        query=parts.query,
        method="POST" if call else method.upper(),
        headers=tuple(headers),
        scheme=scheme,
        sni=parts.hostname if scheme == "https" else "",
        grpc=call,
    )
    decision = match(local.config.table, request)
    data = {"gateway": local.config.name, "request": url, **render.decision_data(decision)}
    if call and decision.status:  # answered by the gateway: a trailers-only gRPC status
        code = grpc.code_for(decision.status)
        data["grpcStatus"] = f"{int(code)} {code.name} (HTTP 200, trailers-only)"
    # What the wire shows before any HTTP answer: the proxy binds only the table's ports, and
    # its TLS callback refuses a name no HTTPS listener covers (certificates.py).
    if local.config.table.port(port) is None:
        data["connection"] = f"refused: nothing listens on port {port}"
    elif scheme == "https" and decision.listener is None:
        data["connection"] = (
            f"TLS handshake refused: no HTTPS listener on port {port} covers {parts.hostname}"
        )
    options.write_output(out.render(data, output), output_file)


_GRPC_SCHEMES = {"grpc": "http", "grpcs": "https"}  # explain's gRPC URLs: h2c, or over TLS


def _explain_stream(
    gateway_config: GatewayConfig, scheme: str, sni: str, port: int
) -> dict[str, Any]:
    """``explain`` of a TLS passthrough (by SNI) or TCP connection, and what the wire shows."""
    from meshctl.core.gateway import eastwest, render
    from meshctl.core.gateway.matching import Outcome, passthrough, tcp
    from meshctl.core.gateway.model import Protocol

    table = gateway_config.table
    if scheme == "tls" and eastwest.auto_passthrough_port(table, port):  # Istio's 15443
        found = eastwest.destination(gateway_config, sni, "cluster.local")
        east_west = {"gateway": gateway_config.name, **eastwest.destination_data(found)}
        if found.outcome is not eastwest.Outcome.FORWARD:
            east_west["connection"] = "closed"
        return east_west
    decision = passthrough(table, port, sni) if scheme == "tls" else tcp(table, port)
    data: dict[str, Any] = {"gateway": gateway_config.name, **render.decision_data(decision)}
    served = table.port(port)
    wanted = Protocol.TLS if scheme == "tls" else Protocol.TCP
    if served is None:
        data["connection"] = f"refused: nothing listens on port {port}"
    elif served.protocol is not wanted:
        data["connection"] = f"port {port} is a {served.protocol} listener, not {wanted}"
    elif decision.outcome is not Outcome.FORWARD:
        data["connection"] = "closed"
    return data
