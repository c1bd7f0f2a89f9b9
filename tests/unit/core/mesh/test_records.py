"""Records <-> ztunnel's local-config form: what the supervisor sends the data plane."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from meshctl.core.mesh.localconfig import parse_local_config, parse_record
from meshctl.core.mesh.records import Kind, record_key
from meshctl.core.mesh.render import render, update_from_plain, update_to_plain
from meshctl.core.mesh.store import Store, Update
from tests.unit.record_strategies import policies, services, workloads

KINDS = {"Workload": Kind.WORKLOAD, "Service": Kind.SERVICE, "Policy": Kind.POLICY}


@settings(deadline=None)  # a loaded CI machine is slow, not wrong
@given(st.one_of(workloads, services, policies))
def test_every_record_reads_back_as_itself_after_json(record):
    kind = KINDS[type(record).__name__]
    doc = json.loads(json.dumps(render(record)))
    assert parse_record(kind, doc) == record


@settings(deadline=None)  # a loaded CI machine is slow, not wrong
@given(st.one_of(workloads, services, policies), st.booleans())
def test_updates_cross_the_channel_unchanged(record, removal):
    kind = KINDS[type(record).__name__]
    update = Update(
        kind=kind, key=record_key(record), record=None if removal else record, version="v7"
    )
    assert update_from_plain(json.loads(json.dumps(update_to_plain(update)))) == update


@settings(deadline=None)  # a loaded CI machine is slow, not wrong
@given(st.lists(workloads, max_size=4, unique_by=lambda w: w.uid))
def test_a_whole_store_renders_as_a_local_config_it_reads_back(ws):
    ips = [ip for w in ws for ip in w.workload_ips]
    if len(ips) != len(set(ips)):
        return  # a local config refuses shared IPs
    doc = {"workloads": [render(w) for w in ws]}
    assert parse_local_config(json.loads(json.dumps(doc))).workloads == Store.build(ws).workloads
