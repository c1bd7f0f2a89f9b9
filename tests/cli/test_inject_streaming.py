"""``meshctl inject -f`` one document at a time: memory stays flat however long the input, every
``-o`` format prints what rendering the whole list at once prints, and nothing is written when a
later document fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshctl.cli import main
from meshctl.core.k8s.inject.documents import inject_documents, load
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.output import render_objects
from tests.bench.bench_inject import deployment
from tests.harness.measured import meshctl

DATA = Path(__file__).resolve().parents[1] / "testdata" / "inject"
IMAGE = "registry.example/meshctl:test"


def manifest(path: Path, count: int) -> Path:
    path.write_text(render_objects([deployment(i) for i in range(count)], "yaml"))
    return path


def test_memory_stays_flat_as_the_input_grows(tmp_path: Path):
    # 4,000 Deployments (3 MiB in, 28 MiB out) against 400: reading all first, the whole
    # injected list, and its text took ~150 MiB more; one at a time, the same few MiB.
    peaks = []
    for count in (400, 4000):
        source = manifest(tmp_path / f"d{count}.yaml", count)
        out = tmp_path / f"o{count}.yaml"
        run = meshctl("inject", "-f", str(source), "-O", str(out), "--image", IMAGE, timeout=120)
        assert run.returncode == 0, run.describe()
        assert out.read_text().count("\n---\n") == count - 1
        peaks.append(run.max_rss_mib)
    assert peaks[1] - peaks[0] < 20, f"peak RSS {peaks[0]:.0f} MiB -> {peaks[1]:.0f} MiB"


@pytest.mark.parametrize("fmt", ["yaml", "json", "name", "table"])
@pytest.mark.parametrize(
    "names", [["deployment.yaml"], ["multidoc.yaml", "list.yaml"]], ids=["one", "several"]
)
def test_each_format_prints_what_the_whole_list_renders_to(
    fmt: str, names: list[str], capsys: pytest.CaptureFixture[str]
):
    settings = InjectSettings(image=IMAGE)
    objects = []
    for name in names:
        text = (DATA / name).read_text()
        objects.extend(inject_documents(load(text, str(DATA / name)), name, settings)[0])
    args = [a for name in names for a in ("-f", str(DATA / name))]
    code = main(["inject", *args, "-o", fmt, "--image", IMAGE])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out == render_objects(objects, fmt)


def test_a_bad_document_late_in_the_stream_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    source = manifest(tmp_path / "d.yaml", 50)
    with source.open("a") as handle:
        handle.write("---\napiVersion: v1\nmetadata: {name: x}\n")
    target = tmp_path / "out.yaml"
    target.write_text("kept\n")
    for extra in ([], ["-O", str(target)]):
        code = main(["inject", "-f", str(source), "--image", IMAGE, *extra])
        out, err = capsys.readouterr()
        assert (code, out) == (1, "")
        assert "(document 51)" in err
        assert "the object has no kind" in err
    assert target.read_text() == "kept\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.yaml.")]
