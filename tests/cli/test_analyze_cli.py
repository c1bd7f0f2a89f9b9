"""``meshctl analyze`` from the command line: files alone (``--use-kube=false``) against golden
reports, the exit code and its threshold, namespace scope, the codes list, and clean one-line
errors for bad input and an absent cluster. The live and layered modes: tests/kube."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from meshctl.cli import main
from meshctl.core.analyze.codes import CODES
from tests.harness.golden import assert_golden

DATA = Path(__file__).resolve().parents[1] / "testdata" / "analyze"
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "analyze"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "analyze.md"
OFFLINE = ("analyze", "--use-kube=false", "-f", "healthy.yaml", "-f", "mistakes.yaml")


@pytest.fixture(autouse=True)
def in_testdata(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run where the inputs are, so reports name them as a user typing -f would see them."""
    monkeypatch.chdir(DATA)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def one_error(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 2, err
    assert lines[0].startswith("Error: "), err
    assert lines[1].startswith("Hint: "), err
    return err


def test_every_mistake_in_the_files_is_reported_with_file_line_and_fix_and_exits_3(capsys):
    code, out, err = run(capsys, *OFFLINE)
    assert code == 3, err
    assert_golden(GOLDEN / "mistakes.txt.golden", out)


def test_the_report_does_not_depend_on_the_order_of_the_files(capsys):
    _, forward, _ = run(capsys, *OFFLINE)
    _, backward, _ = run(
        capsys, "analyze", "--use-kube=false", "-f", "mistakes.yaml", "-f", "healthy.yaml"
    )
    assert forward == backward


def test_the_json_report_holds_each_finding_as_data(capsys):
    code, out, err = run(capsys, *OFFLINE, "-o", "json")
    assert code == 3, err
    assert_golden(GOLDEN / "mistakes.json.golden", out)
    first = json.loads(out)[0]
    assert set(first) == {"code", "name", "level", "object", "message", "fix"}


def test_the_healthy_files_have_no_findings_and_exit_0(capsys):
    code, out, err = run(capsys, "analyze", "--use-kube=false", "-f", "healthy.yaml")
    assert (code, err) == (0, "")
    assert out == "\u2714 No validation issues found when analyzing all namespaces.\n"
    code, out, _ = run(capsys, "analyze", "--use-kube=false", "-f", "healthy.yaml", "-o", "json")
    assert (code, json.loads(out)) == (0, [])


def test_warnings_exit_0_unless_the_failure_threshold_says_otherwise(capsys, tmp_path):
    typo = tmp_path / "typo.yaml"
    typo.write_text(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n"
        "metadata: {name: typo, namespace: shop}\nspec: {selector: {matchLabels: {app: x}}}\n"
    )
    args = ("analyze", "--use-kube=false", "-f", "healthy.yaml", "-f", str(typo))
    code, out, _ = run(capsys, *args)
    assert code == 0
    assert out.startswith(f"Warning [MSH0101] (AuthorizationPolicy shop/typo {typo}:1)")
    assert run(capsys, *args, "--failure-threshold", "Warning")[0] == 3
    assert run(capsys, *args, "--failure-threshold", "Info")[0] == 3


def test_report_threshold_hides_lower_levels_but_not_from_the_exit_code(capsys, tmp_path):
    code, out, _ = run(capsys, *OFFLINE, "--report-threshold", "Error", "-o", "json")
    assert code == 3
    assert {f["level"] for f in json.loads(out)} == {"Error"}
    legacy = tmp_path / "legacy.yaml"  # a namespace with a pod and no mesh label: one Info
    legacy.write_text(
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: legacy}\n---\n"
        "apiVersion: v1\nkind: Pod\nmetadata: {name: a, namespace: legacy}\n"
        "spec: {containers: [{name: a, image: a}]}\n"
    )
    only_info = ("analyze", "--use-kube=false", "-f", "healthy.yaml", "-f", str(legacy))
    assert run(capsys, *only_info, "-o", "name")[1] == "MSH0206 Namespace legacy\n"
    code, out, _ = run(capsys, *only_info, "-n", "legacy", "--report-threshold", "Warning")
    assert code == 0
    assert out == (
        "\u2714 No validation issues found when analyzing namespace: legacy "
        "(1 below --report-threshold not shown).\n"
    )


def test_namespace_limits_the_report_and_default_puts_objects_without_one(capsys, tmp_path):
    code, out, _ = run(capsys, *OFFLINE, "-n", "canary-shop", "-o", "name")
    assert code == 3
    # the namespace's own finding, and the cluster-wide revision conflict
    assert out.splitlines() == [
        "MSH0202 Namespace canary-shop",
        "MSH0302 Deployment meshctl-system/meshctl-controlplane",
        "MSH0302 Deployment other-mesh/meshctl-controlplane",
    ]
    bare = tmp_path / "bare.yaml"
    bare.write_text(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: p}\n"
        "spec: {selector: {matchLabels: {app: x}}}\n"
    )
    code, out, _ = run(capsys, "analyze", "--use-kube=false", "-f", str(bare), "-n", "team")
    assert out.startswith("Warning [MSH0101] (AuthorizationPolicy team/p ")


def test_list_codes_prints_the_registry(capsys):
    code, out, _ = run(capsys, "analyze", "--list-codes", "-o", "json")
    assert code == 0
    assert [c["code"] for c in json.loads(out)] == [c.id for c in CODES]


def test_docs_explain_every_code_with_its_name_and_level():
    page = DOCS.read_text()
    headings = re.findall(r"^### (MSH\d{4}) (\w+) \((Error|Warning|Info)\)$", page, re.M)
    assert headings == [(c.id, c.name, c.level.label) for c in CODES]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--use-kube=false",), "--use-kube=false analyzes files: none given"),
        (("--use-kube=false", "-f", "missing.yaml"), "cannot read missing.yaml"),
        (("-A", "-n", "x", "--use-kube=false", "-f", "healthy.yaml"), "-n and --all-namespaces"),
    ],
)
def test_bad_input_is_a_usage_error(capsys, args, message):
    code, _, err = run(capsys, "analyze", *args)
    assert code == 2, err
    assert message in one_error(err)


def test_files_without_any_object_are_a_usage_error(capsys, tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n---\n")
    code, _, err = run(capsys, "analyze", "--use-kube=false", "-f", str(empty))
    assert code == 2, err
    assert "no Kubernetes object to analyze" in one_error(err)


def test_a_document_that_is_no_object_names_its_file_and_line(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Namespace\napiVersion: v1\nmetadata: {name: a}\n---\n- not an object\n")
    code, _, err = run(capsys, "analyze", "--use-kube=false", "-f", str(bad))
    assert code == 2, err
    assert f"{bad}:5" in one_error(err)


KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: gone, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: gone, context: {cluster: gone, user: u}}]
current-context: gone
"""


def test_without_a_cluster_it_is_one_error_naming_the_way_out(capsys, tmp_path):
    config = tmp_path / "kubeconfig"
    config.write_text(KUBECONFIG)
    args = ("--kubeconfig", str(config), "--request-timeout", "2s", "analyze")
    code, _, err = run(capsys, *args, "-f", "healthy.yaml")
    assert code == 1, err
    assert "or analyze the files alone with --use-kube=false" in one_error(err)
    code, _, err = run(capsys, *args)
    assert code == 1, err
    assert "--use-kube" not in one_error(err)
