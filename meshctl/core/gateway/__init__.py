"""The ingress gateway's pure core: Gateway API and Ingress objects in, route tables and status
out; a request in, a routing decision out.

- ``model``: listeners, routes, rules, backends and the route table a proxy consumes.
- ``matching``: ``match(table, request) -> Decision`` by the API's precedence; ``choose_backend``
  with the caller's random draw. ``filters``: header modifiers, redirects, rewrites. ``grpc``:
  which requests are gRPC calls, the method match, the gateway's own answers as gRPC statuses.
- ``translate``: the whole cluster -> tables per Gateway and for Ingress, and every status we
  own (``gatewayapi``, ``rules``, ``grpcroute``, ``backends``, ``gateways``, ``attachment``,
  ``ingress``, ``conditions`` are its parts). ``table``: the precedence order; ``hostnames``
  and ``paths``: the API's matching rules. ``render``: tables and decisions as plain data.
- ``config``: what one proxy is given (table, certificates, endpoints): the seam between the
  controller (or a local file) and ``meshctl gateway run``.
"""
