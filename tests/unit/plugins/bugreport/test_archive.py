"""The archive: summary first, one top folder, whole or not at all (errors and Ctrl-C)."""

from __future__ import annotations

import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from meshctl_plugins.bugreport import archive

from meshctl.core.bugreport.layout import SUMMARY, Member
from meshctl.errors import MeshctlError


def test_members_are_written_in_order_under_one_folder(tmp_path: Path):
    target = tmp_path / "report.tar.gz"
    members = [Member(SUMMARY, b"# summary\n", -1), Member("logs/a/b/c.log", b"line\n", 7)]
    size = archive.write(target, members, now=1_700_000_000)
    assert size == target.stat().st_size
    assert target.stat().st_mode & 0o777 == 0o600
    with tarfile.open(target, "r:gz") as tar:
        infos = tar.getmembers()
        assert [i.name for i in infos] == ["report/SUMMARY.md", "report/logs/a/b/c.log"]
        assert all(i.isfile() and i.mode == 0o644 and i.mtime == 1_700_000_000 for i in infos)
        extracted = tar.extractfile(infos[1])
        assert extracted is not None
        assert extracted.read() == b"line\n"
    assert [p.name for p in tmp_path.iterdir()] == ["report.tar.gz"]


def test_the_default_name_is_timestamped_in_the_current_directory():
    assert str(archive.default_name(0)) == "meshctl-bug-report-19700101-000000.tar.gz"
    assert archive.top_directory(Path("x/y.tgz")) == "y"


class _Interrupted(Sequence[Member]):
    """Members that stop half way, as Ctrl-C would."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index):  # type: ignore[override]
        raise NotImplementedError

    def __iter__(self) -> Iterator[Member]:
        yield Member("a", b"x" * 100_000, 0)
        raise self.error


@pytest.mark.parametrize("error", [KeyboardInterrupt(), OSError(28, "No space left on device")])
def test_an_interrupted_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, error):
    target = tmp_path / "report.tar.gz"
    target.write_bytes(b"the previous report")
    expected = MeshctlError if isinstance(error, OSError) else KeyboardInterrupt
    with pytest.raises(expected):
        archive.write(target, _Interrupted(error))
    assert target.read_bytes() == b"the previous report"
    assert [p.name for p in tmp_path.iterdir()] == ["report.tar.gz"]


def test_a_directory_that_cannot_be_written_is_one_error(tmp_path: Path):
    with pytest.raises(MeshctlError, match="cannot write"):
        archive.write(tmp_path / "missing" / "r.tar.gz", [])
