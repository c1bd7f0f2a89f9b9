"""Hypothesis strategies for store records (valid ones: what any source may produce)."""

from __future__ import annotations

import ipaddress

from hypothesis import strategies as st

from meshctl.core.mesh.records import (
    Action,
    Policy,
    Protocol,
    RbacMatch,
    Scope,
    Service,
    StringMatch,
    Workload,
)

names = st.from_regex(r"[a-z]([a-z0-9-]{0,6}[a-z0-9])?", fullmatch=True)
ips = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6))
ports = st.integers(1, 65535)
port_maps = st.dictionaries(ports, st.integers(0, 65535), max_size=3)

workloads = st.builds(
    Workload,
    uid=names.map(lambda n: f"c//Pod/ns/{n}"),
    name=names,
    namespace=names,
    service_account=names,
    workload_ips=st.lists(ips, max_size=2).map(tuple),
    protocol=st.sampled_from(Protocol),
    network=st.sampled_from(["", "net1"]),
    trust_domain=st.sampled_from(["cluster.local", "td.example"]),
    node=names,
    workload_name=names,
    workload_type=st.sampled_from(["deployment", "cronjob", "pod", "job"]),
    canonical_name=names,
    canonical_revision=names,
    cluster_id=st.sampled_from(["Kubernetes", "c2"]),
    authorization_policies=st.lists(names.map(lambda n: f"ns/{n}"), max_size=2).map(tuple),
    healthy=st.booleans(),
    services=st.dictionaries(names.map(lambda n: f"ns/{n}.svc"), port_maps, max_size=2),
    extra=st.fixed_dictionaries(
        {},
        optional={
            "hostname": names,
            "nativeTunnel": st.just(True),
            "networkMode": st.just("HostNetwork"),
            "capacity": st.integers(0, 100),
            "locality": st.fixed_dictionaries({"region": names, "zone": names, "subzone": names}),
            "applicationTunnel": st.fixed_dictionaries(
                {"protocol": st.sampled_from(["NONE", "PROXY"]), "port": ports}
            ),
            "waypoint": st.fixed_dictionaries(
                {
                    "destination": st.one_of(
                        ips.map(lambda i: f"/{i}"), names.map(lambda n: f"ns/{n}")
                    ),
                    "hboneMtlsPort": ports,
                }
            ),
        },
    ),
)
services = st.builds(
    Service,
    name=names,
    namespace=names,
    hostname=names.map(lambda n: f"{n}.ns.svc.cluster.local"),
    vips=st.lists(st.tuples(st.sampled_from(["", "n"]), ips), max_size=2).map(tuple),
    ports=port_maps,
    subject_alt_names=st.lists(names, max_size=1).map(tuple),
)
string_matches = st.one_of(
    st.builds(StringMatch, kind=st.sampled_from(["exact", "prefix", "suffix"]), value=names),
    st.just(StringMatch(kind="presence")),
)
networks = ips.flatmap(
    lambda ip: st.integers(0, ip.max_prefixlen).map(
        lambda n: ipaddress.ip_network((ip, n), strict=False)
    )
)
matches = st.builds(
    RbacMatch,
    namespaces=st.lists(string_matches, max_size=2).map(tuple),
    not_principals=st.lists(string_matches, max_size=2).map(tuple),
    service_accounts=st.lists(st.tuples(names, names), max_size=1).map(tuple),
    source_ips=st.lists(networks, max_size=2).map(tuple),
    not_destination_ips=st.lists(networks, max_size=1).map(tuple),
    destination_ports=st.lists(ports, max_size=2).map(tuple),
    not_destination_ports=st.lists(ports, max_size=1).map(tuple),
)
policies = st.builds(
    Policy,
    name=names,
    namespace=names,
    scope=st.sampled_from(Scope),
    action=st.sampled_from(Action),
    rules=st.lists(
        st.lists(st.lists(matches, max_size=2).map(tuple), max_size=2).map(tuple), max_size=2
    ).map(tuple),
    dry_run=st.booleans(),
)
