"""Where ``inject -f`` writes while it works: output staged until the input is all done, and the
writers of each ``-o`` format that take one object at a time.

Owns the all-or-nothing rule of ``meshctl inject -f``: text goes to a temporary file beside the
``-O`` target (renamed over it by ``commit``) or to a spooled buffer (copied to stdout by
``commit``; in memory up to a few MiB, then on disk); leaving the block without ``commit`` throws
it away. The writers produce exactly what ``meshctl.output.render_objects`` produces for the whole
list (one JSON object, or a ``v1 List`` for several; YAML documents joined by ``---``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from meshctl.errors import MeshctlError
from meshctl.output import OutputFormat, YamlWriter, json_text, kubernetes_order, render_objects

_SPOOL_BYTES = 8 << 20  # stdout's staged text stays in memory up to this, then goes to disk


class StagedOutput:
    """Text for stdout or ``target``, released by ``commit`` and discarded otherwise."""

    def __init__(self, target: Path | None) -> None:
        self._target = target.expanduser() if target is not None else None
        self._temp: Path | None = None
        self.handle: IO[str]

    def __enter__(self) -> StagedOutput:
        if self._target is None:
            self.handle = tempfile.SpooledTemporaryFile(
                max_size=_SPOOL_BYTES, mode="w+", encoding="utf-8"
            )
            return self
        try:
            fd, temp = tempfile.mkstemp(
                dir=self._target.parent, prefix=f".{self._target.name}.", suffix=".tmp"
            )
        except OSError as exc:
            raise MeshctlError(
                f"cannot write {self._target}: {exc.strerror or exc}",
                hint="check that the directory exists and is writable",
            ) from exc
        self._temp = Path(temp)
        self.handle = os.fdopen(fd, "w", encoding="utf-8")
        return self

    def commit(self) -> None:
        """Release the text: copy it to stdout, or put the file in place atomically."""
        if self._target is None:
            self.handle.seek(0)
            shutil.copyfileobj(self.handle, sys.stdout, 1 << 20)
            sys.stdout.flush()
            return
        assert self._temp is not None  # noqa: S101 -- set by __enter__ with a target
        try:
            self.handle.close()
            # mkstemp makes the file 0600; keep the mode of the file replaced, else 0644 less
            # umask.
            try:
                mode = self._target.stat().st_mode & 0o777
            except FileNotFoundError:
                umask = os.umask(0)
                os.umask(umask)
                mode = 0o666 & ~umask
            self._temp.chmod(mode)
            self._temp.replace(self._target)
        except OSError as exc:
            raise MeshctlError(
                f"cannot write {self._target}: {exc.strerror or exc}",
                hint="check the path and free space",
            ) from exc
        self._temp = None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.handle.close()
        if self._temp is not None:  # not committed: nothing reaches the target
            self._temp.unlink(missing_ok=True)


class ObjectWriter:
    """Writes objects one at a time in one ``-o`` format; ``finish`` ends the text."""

    def __init__(self, handle: IO[str]) -> None:
        self.handle = handle
        self.count = 0

    def add(self, obj: Any) -> None:
        self.count += 1
        self._add(obj)

    def _add(self, obj: Any) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        """Called once after the last object."""


class _Yaml(ObjectWriter):
    def __init__(self, handle: IO[str]) -> None:
        super().__init__(handle)
        self._writer = YamlWriter()

    def _add(self, obj: Any) -> None:
        if self.count > 1:
            self.handle.write("---\n")
        self.handle.write(self._writer.document(obj))


class _Json(ObjectWriter):
    """One object alone; from the second on, the ``v1 List`` kubectl prints, item by item."""

    def __init__(self, handle: IO[str]) -> None:
        super().__init__(handle)
        self._first: Any = None

    def _add(self, obj: Any) -> None:
        if self.count == 1:
            self._first = obj
            return
        if self.count == 2:
            self.handle.write('{\n  "apiVersion": "v1",\n  "kind": "List",\n  "items": [\n')
            self._item(self._first)
            self._first = None
        self.handle.write(",\n")
        self._item(obj)

    def _item(self, obj: Any) -> None:
        text = json.dumps(kubernetes_order(obj), indent=2, ensure_ascii=False)
        self.handle.write("\n".join("    " + line for line in text.split("\n")))

    def finish(self) -> None:
        if self.count == 1:
            self.handle.write(json_text(self._first))
        elif self.count > 1:
            self.handle.write("\n  ]\n}\n")


class _Names(ObjectWriter):
    def _add(self, obj: Any) -> None:
        self.handle.write(render_objects([obj], OutputFormat.NAME))


class _Table(ObjectWriter):
    """Rows need every object's width: keeps only what the table shows of each."""

    def __init__(self, handle: IO[str]) -> None:
        super().__init__(handle)
        self._stubs: list[Any] = []

    def _add(self, obj: Any) -> None:
        self._stubs.append(_stub(obj))

    def finish(self) -> None:
        self.handle.write(render_objects(self._stubs, OutputFormat.TABLE))


def _stub(obj: Any) -> Any:
    if not isinstance(obj, dict):
        return obj
    stub = {k: obj[k] for k in ("apiVersion", "kind") if k in obj}
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        stub["metadata"] = {k: metadata[k] for k in ("name", "namespace") if k in metadata}
    items = obj.get("items")
    if isinstance(items, list):
        stub["items"] = [_stub(item) for item in items]
    return stub


def writer_for(fmt: OutputFormat, handle: IO[str]) -> ObjectWriter:
    writers: dict[OutputFormat, type[ObjectWriter]] = {
        OutputFormat.YAML: _Yaml,
        OutputFormat.JSON: _Json,
        OutputFormat.NAME: _Names,
        OutputFormat.TABLE: _Table,
    }
    return writers[OutputFormat(fmt)](handle)
