"""The pure core: values in, values out. No sockets, subprocesses, asyncio, env, files, clock,
randomness or threads here (an import-linter contract holds it).

The map, by concern (each subpackage opens with what it owns; a layers contract keeps the
arrows pointing down):

- ``k8s/``: Kubernetes objects as mesh values: ``cluster/`` (Pods, Services, EndpointSlices,
  AuthorizationPolicies as store records), ``inject/`` (the sidecar injector's pipeline),
  ``install/`` (components, values, manifests, drift, verify's checks), ``cni/`` (the CNI
  spec, network configs, which pods the plugin captures), ``ambient`` (enrollment and the node
  agent's exit), ``podlist`` (a node's pods from a file), pod-spec pieces, the image, probes,
  ProxyConfig.
- ``gateway/``: the ingress gateway as values: Gateway API and Ingress objects -> route tables
  and status, a request -> a routing decision by the APIs' precedence (above ``k8s/``: it reads
  objects with its readers).
- ``capture/``: traffic-capture rules as data, rendered to and parsed from iptables-restore text.
- ``xds/``: Delta xDS streams as state machines and the resources each proxy may see.
- ``wire/``: wire schemas and protocols: the supervisor channel, ZDS, HBONE (sans-IO HTTP/2
  CONNECT), and what a packet capture shows.
- ``mesh/``: the mesh model: records (workloads, services, policies), the store and its
  lookups, ztunnel's local config (read and rendered), L4 authorization, inbound services.
- ``pki/``: the CA's rules, certificates, callers and SPIFFE identities; ``tree``: the manifest
  of a frozen one-dir tree; ``backoff``: the one retry policy value (watches, the supervisor,
  the work queue, the xDS client).
"""
