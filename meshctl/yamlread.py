"""YAML a user or a peer controls, built straight from libyaml's events within
``structured.Limits``: the YAML half of the one bounded reader (JSON: ``meshctl.structured``).

Owns ``yaml_documents`` and ``load_yaml``: values are built as the parser reports them (no node
graph), so every limit is checked before the work it guards is done: the nodes of a document are
counted with each alias written out in full (an alias bomb stops at the limit, in milliseconds),
depth is counted through aliases, and an alias to a node that is still open (a self-reference)
is refused. Anything else comes out as PyYAML's safe loader builds it (scalars resolved by its
resolver, without timestamps; merge keys ``<<`` as the merge-key spec has them: own keys win,
then earlier mappings); tags that name no JSON value (``!!binary``, custom ones) are refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

import yaml
from yaml import events as ev
from yaml.nodes import ScalarNode

from meshctl.structured import (
    DEPTH_CEILING,
    ENV_MAX_DEPTH,
    ENV_MAX_NODES,
    Document,
    InputError,
    Limits,
    decode,
    too_large,
)

# libyaml's C parser is several times faster than the pure-Python one (the inject benchmark
# depends on it); PyYAML's wheels ship it, source builds may not.
try:
    from yaml import CSafeLoader as _BaseLoader
except ImportError:  # pragma: no cover -- PyYAML built without libyaml
    from yaml import SafeLoader as _BaseLoader  # type: ignore[assignment]

_TIMESTAMP = "tag:yaml.org,2002:timestamp"
_STR = "tag:yaml.org,2002:str"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
_MERGE = "tag:yaml.org,2002:merge"
_VALUE = "tag:yaml.org,2002:value"
_CACHE_ENTRIES = 8192  # per cache; cleared when full (names differ from object to object)


class _Loader(_BaseLoader):
    """Safe loading without the timestamp resolver: ``2024-01-01`` stays the string it is."""

    yaml_implicit_resolvers = {  # noqa: RUF012 -- PyYAML's per-class table, replaced whole
        first: [(tag, regexp) for tag, regexp in resolvers if tag != _TIMESTAMP]
        for first, resolvers in _BaseLoader.yaml_implicit_resolvers.items()
    }


class _MergeKey:
    """What a ``<<`` key builds: its value is merged into the mapping, not stored."""


_MERGE_KEY = _MergeKey()
_NO_KEY = object()


class _TooLargeError(Exception):
    """Raised inside libyaml's read callback; translated once the parser hands it back."""


class _Metered:
    """A binary stream that counts what one document makes us hold and remembers where lines
    end, so a decoding error can name its line."""

    def __init__(self, raw: BinaryIO, limit: int) -> None:
        self._raw, self._limit = raw, limit
        self.total = 0
        self.document_start = 0
        self._recent: list[tuple[int, int, bytes]] = []  # (offset, lines before, chunk)
        self._lines = 0

    def read(self, size: int = -1) -> bytes:
        chunk = self._raw.read(size if size and size > 0 else 1 << 16)
        self._recent = [*self._recent[-3:], (self.total, self._lines, chunk)]
        self.total += len(chunk)
        self._lines += chunk.count(b"\n")
        if self.total - self.document_start > self._limit:
            raise _TooLargeError
        return chunk

    def line_of(self, offset: int) -> int | None:
        for start, before, chunk in reversed(self._recent):
            if start <= offset <= start + len(chunk):
                return before + chunk.count(b"\n", 0, offset - start) + 1
        return None


class _Frame:
    """An open mapping or list."""

    __slots__ = ("anchor", "container", "deepest", "key", "line", "merges", "nodes", "track")

    def __init__(self, container: Any, line: int) -> None:
        self.container = container
        self.key: Any = _NO_KEY
        self.line = line
        self.anchor: str | None = None
        self.nodes = 0  # the document's node count when an anchored frame opened
        self.deepest = 0  # the depth reached before an anchored frame opened
        self.merges: list[tuple[Any, Any]] | None = None
        self.track: list[int] | None = None  # a List's items: where each starts


def load_yaml(data: str | bytes, source: str, limits: Limits = Limits()) -> Any:  # noqa: B008
    """The one document of ``data`` (None when empty); more than one is an ``InputError``."""
    documents = list(yaml_documents(data, source, limits))
    if len(documents) > 1:
        raise InputError(
            source,
            f"holds {len(documents)} YAML documents; one is expected",
            line=documents[1].line,
            hint="remove the '---' separators, or give one document",
        )
    return documents[0].data if documents else None


def yaml_documents(
    data: str | bytes | BinaryIO,
    source: str,
    limits: Limits = Limits(),  # noqa: B008
) -> Iterator[Document]:
    """Every non-empty document of ``data``, one at a time, in order (a stream is read as the
    documents come, and no more than ``limits.max_bytes`` is held for one document)."""
    if isinstance(data, str | bytes):
        if len(data) > limits.max_bytes:
            raise too_large(source, limits)
        if isinstance(data, bytes):
            data = decode(data, source)
    return _documents(data, source, limits)


def _documents(data: str | BinaryIO, source: str, limits: Limits) -> Iterator[Document]:
    stream = data if isinstance(data, str) else _Metered(data, limits.max_bytes)
    loader = _Loader(stream)
    reader = _Reader(loader, source, limits)
    try:
        while True:
            try:
                document = reader.next_document()
            except _TooLargeError:
                raise too_large(source, limits) from None
            except yaml.MarkedYAMLError as exc:
                raise _syntax_error(exc, source, limits) from None
            except yaml.reader.ReaderError as exc:
                raise _reader_error(exc, source, data, stream) from None
            except yaml.YAMLError as exc:  # pragma: no cover -- every libyaml error is above
                raise InputError(source, f"invalid YAML: {_flat(str(exc))}") from None
            if document is None:
                return
            if document.data is not None:
                yield document
            if isinstance(stream, _Metered):
                stream.document_start = stream.total
    finally:
        loader.dispose()


class _Reader:
    """Builds one document at a time from the loader's events."""

    def __init__(self, loader: _Loader, source: str, limits: Limits) -> None:
        self._loader = loader
        self._source = source
        self._limits = limits
        self._tags: dict[str, str] = {}  # a plain scalar's resolved tag
        self._values: dict[tuple[str, str], Any] = {}
        self._convert: dict[str, Callable[[ScalarNode], Any]] = {
            "tag:yaml.org,2002:int": loader.construct_yaml_int,
            "tag:yaml.org,2002:float": loader.construct_yaml_float,
            "tag:yaml.org,2002:bool": loader.construct_yaml_bool,
            "tag:yaml.org,2002:null": loader.construct_yaml_null,
        }
        self._started = False
        self._resolve: Callable[..., str] = loader.resolve

    def next_document(self) -> Document | None:  # noqa: PLR0912, PLR0915 -- the hot loop
        """The next document (its data None when empty), or None at the end of the stream."""
        get: Callable[[], Any] = self._loader.get_event
        if not self._started:
            get()  # StreamStartEvent
            self._started = True
        event = get()
        if isinstance(event, ev.StreamEndEvent):
            return None
        # Locals: this loop runs once per YAML node (the inject benchmark's rate is set here).
        # The open container, whether it is a list, and its pending key live in locals; the
        # frame keeps them while a child is open.
        scalar_event, alias_event = ev.ScalarEvent, ev.AliasEvent
        mapping_start, sequence_start = ev.MappingStartEvent, ev.SequenceStartEvent
        mapping_end, sequence_end = ev.MappingEndEvent, ev.SequenceEndEvent
        plain_tags = self._tags
        max_depth, max_nodes = self._limits.max_depth, self._limits.max_nodes
        anchors: dict[str, tuple[Any, int, int] | None] = {}
        stack: list[_Frame] = []
        frame: _Frame | None = None
        cur: Any = None
        is_list = False
        key: Any = _NO_KEY
        done: _Frame | None = None
        root: Any = None
        first_line = 0
        nodes = 0
        deepest = 0
        track: list[int] | None = None
        while True:
            event = get()
            kind = event.__class__
            if kind is scalar_event:
                nodes += 1
                value = event.value
                tag = event.tag
                if tag is None or tag == "!":
                    if event.implicit[0]:  # plain: the resolver decides (remembered)
                        tag = plain_tags.get(value)
                        if tag is None:
                            tag = self._resolved(value)
                    else:  # quoted: a string, whatever it looks like
                        tag = _STR
                if tag != _STR:
                    value = self._converted(tag, value, event)
                if event.anchor is not None:
                    self._anchor(anchors, event.anchor, event.start_mark.line + 1)
                    anchors[event.anchor] = (value, 1, -1)
            elif kind is mapping_start or kind is sequence_start:
                nodes += 1
                line = event.start_mark.line + 1
                if track is not None and frame is not None and frame.track is track:
                    track.append(line)
                if len(stack) >= max_depth:
                    raise self._too_deep(line)
                tag = event.tag
                if kind is mapping_start:
                    if tag is not None and tag not in (_MAP, "!"):
                        raise self._unsupported(tag, line)
                    opened = _Frame({}, line)
                else:
                    if tag is not None and tag not in (_SEQ, "!"):
                        raise self._unsupported(tag, line)
                    opened = _Frame([], line)
                    if track is None and len(stack) == 1 and key == "items":
                        opened.track = track = []
                if event.anchor is not None:
                    self._anchor(anchors, event.anchor, line)
                    anchors[event.anchor] = None  # open: an alias to it now is a cycle
                    opened.anchor, opened.nodes, opened.deepest = event.anchor, nodes, deepest
                    deepest = len(stack) + 1
                if frame is None:
                    first_line = line
                else:
                    frame.key = key
                stack.append(opened)
                frame, cur, is_list, key = opened, opened.container, kind is sequence_start, _NO_KEY
                deepest = max(deepest, len(stack))
                if nodes > max_nodes:
                    raise self._too_many(line)
                continue
            elif kind is mapping_end or kind is sequence_end:
                done = stack.pop()
                value = cur
                if done.merges is not None:
                    value = _merged(done.merges, value)
                if done.anchor is not None:
                    height = deepest - len(stack) - 1
                    anchors[done.anchor] = (value, nodes - done.nodes + 1, height)
                    deepest = max(done.deepest, deepest)
                if not stack:
                    root = value
                    frame, cur = None, None
                    continue
                frame = stack[-1]
                cur, key = frame.container, frame.key
                is_list = cur.__class__ is list
            elif kind is alias_event:
                value = self._alias(anchors, event)
                _, size, height = anchors[event.anchor]  # type: ignore[misc]
                nodes += size
                if nodes > max_nodes:
                    raise self._too_many(event.start_mark.line + 1, alias=event.anchor)
                if len(stack) + 1 + height > max_depth:
                    raise self._too_deep(event.start_mark.line + 1)
                deepest = max(deepest, len(stack) + 1 + height)
                if track is not None and frame is not None and frame.track is track:
                    track.append(event.start_mark.line + 1)
            elif kind is ev.DocumentEndEvent:
                return Document(root, first_line, tuple(track or ()))
            else:  # pragma: no cover -- the parser emits nothing else inside a document
                raise InputError(self._source, f"unexpected YAML event {kind.__name__}")
            # A finished value: the document itself, a list item, a mapping's key or value.
            if value is _MERGE_KEY and (cur is None or is_list or key is not _NO_KEY):
                raise self._unsupported(_MERGE, _line(event, done))
            if is_list:
                if track is not None and kind is scalar_event and frame.track is track:  # type: ignore[union-attr]
                    track.append(event.start_mark.line + 1)
                cur.append(value)
            elif cur is None:
                root, first_line = value, event.start_mark.line + 1
            elif key is _NO_KEY:
                if value.__class__ is not str and isinstance(value, dict | list):
                    raise InputError(
                        self._source,
                        "a mapping key is itself a mapping or a list",
                        line=_line(event, done),
                        hint="keys must be strings (or numbers)",
                    )
                key = value
            else:
                if key is _MERGE_KEY:
                    self._merge_into(frame, value, _line(event, done))  # type: ignore[arg-type]
                else:
                    cur[key] = value
                key = _NO_KEY

    def _resolved(self, value: str) -> str:
        """The tag PyYAML's resolver gives a plain scalar (remembered)."""
        if len(self._tags) >= _CACHE_ENTRIES:
            self._tags.clear()
        tag = self._tags[value] = self._resolve(ScalarNode, value, (True, False))
        return tag

    def _alias(self, anchors: dict[str, tuple[Any, int, int] | None], event: Any) -> Any:
        line = event.start_mark.line + 1
        target = anchors.get(event.anchor, _NO_KEY)
        if target is _NO_KEY:
            raise InputError(
                self._source, f"alias *{event.anchor} names no anchor before it", line=line
            )
        if target is None:
            raise InputError(
                self._source,
                f"alias *{event.anchor} refers to a node that contains it "
                "(a self-referencing structure has no end)",
                line=line,
                hint=f"replace *{event.anchor} with a copy of what it should hold",
            )
        assert isinstance(target, tuple)  # noqa: S101 -- narrowed for mypy
        return target[0]

    def _converted(self, tag: str, value: str, event: Any) -> Any:
        """A scalar that is not a string: its value by the safe loader's rules (remembered)."""
        if tag == _MERGE:
            return _MERGE_KEY
        if tag == _VALUE:
            return value  # PyYAML reads a "=" key as the string it is
        cached = self._values.get((tag, value), _NO_KEY)
        if cached is not _NO_KEY:
            return cached
        convert = self._convert.get(tag)
        if convert is None:
            raise self._unsupported(tag, event.start_mark.line + 1)
        try:
            result = convert(ScalarNode(tag, value))
        except (ValueError, yaml.YAMLError) as exc:  # int() beyond its digit limit, mostly
            reason = _flat(str(exc)).split(" for integer string conversion")[0]
            shown = value if len(value) <= 40 else value[:40] + "..."
            raise InputError(
                self._source,
                f"{shown!r} is not a usable {tag.rsplit(':', 1)[-1]} ({reason[:200]})",
                line=event.start_mark.line + 1,
                hint="quote it to keep it a string",
            ) from None
        if len(self._values) >= _CACHE_ENTRIES:
            self._values.clear()
        self._values[(tag, value)] = result
        return result

    def _anchor(self, anchors: dict[str, Any], name: str, line: int) -> None:
        if name in anchors:
            raise InputError(
                self._source, f"anchor &{name} is defined twice", line=line,
                hint="give each anchor its own name",
            )  # fmt: skip

    def _merge_into(self, frame: _Frame, value: Any, line: int) -> None:
        """``<<: *base`` or ``<<: [*a, *b]`` as the YAML merge-key spec says: the mapping's own
        keys win, then the mappings merged earlier; merged keys come first, in order."""
        sources = value if isinstance(value, list) else [value]
        if not all(isinstance(s, dict) for s in sources):
            raise InputError(
                self._source,
                "a merge key '<<' needs a mapping or a list of mappings",
                line=line,
                hint="write '<<: *anchor' with an anchor on a mapping",
            )
        if frame.merges is None:
            frame.merges = []
        for source in sources:
            frame.merges.extend(source.items())

    def _too_deep(self, line: int) -> InputError:
        return InputError(
            self._source,
            f"nested deeper than {self._limits.max_depth} levels (YAML aliases included)",
            line=line,
            hint=f"flatten the input, or raise the limit with ${ENV_MAX_DEPTH} "
            f"(at most {DEPTH_CEILING})",
        )

    def _too_many(self, line: int, alias: str | None = None) -> InputError:
        through = f" (alias *{alias} written out in full)" if alias else ""
        return InputError(
            self._source,
            f"the document holds more than {self._limits.max_nodes} values{through}",
            line=line,
            hint="YAML aliases count each time they are used: an alias bomb is refused; if the "
            f"input is genuine, raise the limit with ${ENV_MAX_NODES}",
        )

    def _unsupported(self, tag: str, line: int) -> InputError:
        shown = tag.replace("tag:yaml.org,2002:", "!!")
        return InputError(
            self._source,
            f"YAML tag {shown} is not supported here (only values JSON can hold)",
            line=line,
            hint="remove the tag; write the value as a string, number, mapping or list",
        )


def _line(event: Any, done: _Frame | None) -> int:
    """The line a finished value starts on: a scalar's or alias's own, a container's opening."""
    if isinstance(event, ev.MappingEndEvent | ev.SequenceEndEvent) and done is not None:
        return done.line
    return int(event.start_mark.line) + 1


def _merged(merges: list[tuple[Any, Any]], own: dict[Any, Any]) -> dict[Any, Any]:
    merged: dict[Any, Any] = {}
    for key, value in merges:
        merged.setdefault(key, value)
    merged.update(own)
    return merged


def _syntax_error(exc: yaml.MarkedYAMLError, source: str, limits: Limits) -> InputError:
    mark = exc.problem_mark or exc.context_mark
    problem = _flat(exc.problem or exc.context or "syntax error")
    line = mark.line + 1 if mark is not None else None
    if "maximum nesting depth" in problem:  # libyaml's own limit (1000) was reached first
        return InputError(
            source,
            f"nested deeper than {limits.max_depth} levels",
            line=line,
            hint=f"flatten the input, or raise the limit with ${ENV_MAX_DEPTH}",
        )
    where = f" at line {line}, column {mark.column + 1}" if mark is not None else ""
    return InputError(
        source,
        f"invalid YAML{where}: {problem}",
        hint="fix the YAML there (the mistake may be just before that point)",
    )


def _reader_error(
    exc: yaml.reader.ReaderError, source: str, data: str | BinaryIO, stream: Any
) -> InputError:
    """libyaml's reader refuses bytes that are not text: name the byte and its line."""
    offset = int(exc.position)
    if isinstance(stream, _Metered):
        line = stream.line_of(offset)
    else:
        assert isinstance(data, str)  # noqa: S101 -- a str was given when not metered
        line = data.encode("utf-8", "surrogatepass")[:offset].count(b"\n") + 1
    reason = str(exc.reason)
    if "UTF" in reason or "Unicode" in reason:
        problem = f"not UTF-8 text (byte {offset} cannot be decoded; binary data?)"
    else:
        problem = f"character #x{int(exc.character):04x} is not allowed in YAML ({reason})"
    return InputError(source, problem, line=line, hint="give a UTF-8 text file")


def _flat(text: str) -> str:
    return " ".join(text.split())
