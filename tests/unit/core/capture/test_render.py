"""Change sets: apply, cleanup and reconcile are one function of (installed, desired)."""

from __future__ import annotations

from meshctl.config import resolve
from meshctl.core.capture.parse import parse
from meshctl.core.capture.plan import plan
from meshctl.core.capture.render import cleanup, diff, quote, render, render_apply, transition
from meshctl.core.capture.rules import Family, RuleSet
from meshctl.core.capture.settings import CaptureSettings

EMPTY = RuleSet(Family.IPV4)


def build(**flags) -> RuleSet:
    return plan(resolve(CaptureSettings, flags=flags, env={})).ruleset(Family.IPV4)


def test_nothing_to_do_when_installed_equals_desired():
    assert transition(build(), build()) == ""
    assert diff(build(), build()) == ""


def test_apply_to_a_fresh_namespace_is_the_rendered_rule_set():
    assert render_apply(build()) == render(build())


def test_cleanup_deletes_our_jumps_then_flushes_and_deletes_our_chains_only():
    text = cleanup(build(redirect_dns=True, capture_all_dns=True))
    lines = text.splitlines()
    assert "-D PREROUTING -p tcp -j MESH_INBOUND" in lines
    assert "-D OUTPUT -j MESH_OUTPUT_DNS" in lines
    deletes = [ln for ln in lines if ln.startswith("-X ")]
    assert {ln.split()[1] for ln in deletes} == {
        "MESH_INBOUND",
        "MESH_IN_REDIRECT",
        "MESH_OUTPUT",
        "MESH_OUTPUT_DNS",
        "MESH_REDIRECT",
    }
    # jumps go before anything is flushed or deleted, per table
    for block in text.split("COMMIT"):
        kinds = [ln[:2] for ln in block.splitlines() if ln.startswith("-")]
        assert kinds == sorted(kinds, key=["-D", "-F", "-X"].index)


def test_reconcile_removes_chains_no_longer_wanted_and_keeps_foreign_rules_out_of_it():
    installed_text = render(build(redirect_dns=True, capture_all_dns=True)).replace(
        "COMMIT", "-A PREROUTING -p udp -j ACCEPT\nCOMMIT", 1
    )
    installed = parse(installed_text)
    text = transition(installed, build())
    assert "-X MESH_OUTPUT_DNS" in text
    assert "-p udp -j ACCEPT" not in text  # a foreign rule is neither deleted nor re-added
    assert "*raw" in text  # the raw table loses its DNS chains entirely


def test_diff_shows_a_missing_rule_as_an_addition():
    desired = build()
    installed_text = render(desired).replace("-A MESH_OUTPUT -d 127.0.0.1/32 -j RETURN\n", "")
    out = diff(parse(installed_text), desired)
    assert "+-A MESH_OUTPUT -d 127.0.0.1/32 -j RETURN" in out
    assert out.startswith("--- installed (IPv4)\n+++ desired (IPv4)\n")


def test_words_with_spaces_or_quotes_are_quoted_as_iptables_save_does():
    assert quote("kubernetes service") == '"kubernetes service"'
    assert quote('say "hi"') == '"say \\"hi\\""'
    assert quote("0x539/0xfff") == "0x539/0xfff"
    assert quote("") == '""'


def test_cleanup_of_nothing_is_nothing():
    assert cleanup(EMPTY) == ""
