"""The response cache: answers already computed, under a hash of all of a request that can change
its answer (:func:`request_key`), least recently used out first within ``max_bytes``. Beside
them, front ends' encoded answers under a request's wire bytes (:func:`replay_key`), so a
request repeated byte for byte is neither decoded nor encoded again. Pure: no loop, no clock."""

from __future__ import annotations

import hashlib
import sys
from collections import OrderedDict, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from carpool.server.inference.admission import AdmittedRequest
from carpool.server.messages import InferRequest, OutputTensor

__all__ = [
    "ENTRY_OVERHEAD",
    "REPLAY_OVERHEAD",
    "SCHEDULING",
    "Entry",
    "Replayed",
    "ResponseCache",
    "replay_key",
    "request_key",
]

#: Request parameters that change when a request is answered, never what: not in the key.
#: (``binary_data_output`` is lifted out of the parameters into its own field, which is.)
SCHEDULING = frozenset({"priority", "timeout"})
#: Bytes an entry holds beyond its arrays' (its key, the records, the arrays' headers, the
#: LRU's node), counted with it: tracemalloc measured ~840 for a one-output entry. A small
#: answer (the demo's 8 floats: 32 bytes) costs more here than its data does.
ENTRY_OVERHEAD = 1024
#: Bytes a :class:`Replayed` holds beyond its encoded answer's data (its key, the record, the
#: answer's objects, the LRU's node), half an entry's: tracemalloc measured ~420 for REST's.
REPLAY_OVERHEAD = ENTRY_OVERHEAD // 2
_KEY_BYTES = 16  # blake2b's digest: 128 bits, no collision in any cache's lifetime
# A replay key is another hash function's (blake2b personalized): no request_key is one.
_REPLAY = b"carpool.replay"
_ABSENT = b"\xff" * 8  # a part not sent: no length (a part is far shorter than 2**64 bytes)
Key = bytes  # a request_key or a replay_key (named: ResponseCache.bytes hides the builtin)


@dataclass(frozen=True, slots=True, eq=False)
class Entry:
    """One cached answer of model ``model``: what a request's encoder reads of it.

    ``admitted`` is the request as admitted, its ``value`` (the admitted inputs) kept only
    where the answer's encoder counts tokens from them (OpenAI's ``usage``), else empty;
    ``outputs`` are the response tensors, each with whether to send it binary. Their arrays
    are copies owned by the entry (read-only): it keeps no request body or batch alive.
    """

    model: str
    admitted: AdmittedRequest
    outputs: tuple[tuple[OutputTensor, bool], ...]

    @classmethod
    def copied(
        cls,
        model: str,
        admitted: AdmittedRequest,
        outputs: Sequence[tuple[OutputTensor, bool]],
        *,
        keep_inputs: bool,
        limit: int | None = None,
    ) -> tuple[Entry, int]:
        """An entry of copies of ``outputs`` (and, with ``keep_inputs``, of the admitted
        inputs), and the bytes it holds (:data:`ENTRY_OVERHEAD` included). If the outputs
        alone pass ``limit`` (the cache's size: it would not be kept), nothing is copied:
        the entry only answers the requests that wait for it."""
        if limit is not None:
            nbytes = ENTRY_OVERHEAD + sum(tensor.data.nbytes for tensor, _ in outputs)
            if nbytes > limit:
                return cls(model, admitted, tuple(outputs)), nbytes
        nbytes = ENTRY_OVERHEAD
        kept = []
        for tensor, binary in outputs:
            data, size = _owned(tensor.data)
            kept.append((OutputTensor(tensor.name, tensor.datatype, tensor.shape, data), binary))
            nbytes += size
        value: dict[str, np.ndarray[Any, Any]] = {}
        if keep_inputs:
            for name, array in admitted.value.items():
                value[name], size = _owned(np.asarray(array))
                nbytes += size
        a = admitted
        slim = AdmittedRequest(value, a.rows, a.outputs, a.priority, a.timeout_ms)
        return cls(model, slim, tuple(kept)), nbytes


@dataclass(frozen=True, slots=True, eq=False)
class Replayed:
    """One encoded answer of model ``model``, as a front end sent it (REST: the body and
    its JSON header's length): what it sends again for the same request's bytes. ``entry``
    is the key of the :class:`Entry` it was encoded from, used again whenever it is."""

    model: str
    encoded: Any
    entry: Key


def _owned(array: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], int]:
    """A read-only copy of ``array`` that owns its data (not a view of a batch or a body),
    and the bytes it holds (a BYTES array's elements too)."""
    copy = array.copy()
    copy.flags.writeable = False
    nbytes = copy.nbytes
    if copy.dtype.hasobject:
        nbytes += sum(sys.getsizeof(item) for item in copy.flat)
    return copy, nbytes


class ResponseCache:
    """Entries by key, in at most ``max_bytes`` (each counted as :meth:`put` is told), the
    least recently used evicted first; one model's dropped at once with :meth:`drop`.

    Not thread-safe: the server's event loop is its only user.
    """

    def __init__(self, max_bytes: int) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_bytes must be a whole number >= 1, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Key, tuple[Entry | Replayed, int]] = OrderedDict()
        self._keys: defaultdict[str, set[Key]] = defaultdict(set)  # model -> its keys
        self._bytes = 0

    @property
    def bytes(self) -> int:
        """The bytes the entries hold (``carpool_cache_bytes``)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key) -> Entry | None:
        """The entry under ``key`` (a :func:`request_key`), now the most recently used;
        None if there is none."""
        found = self._get(key)
        return found if isinstance(found, Entry) else None

    def replayed(self, key: Key) -> Replayed | None:
        """The encoded answer under ``key`` (a :func:`replay_key`), now the most recently
        used, as is the entry it was encoded from; None if there is none."""
        found = self._get(key)
        if not isinstance(found, Replayed):
            return None
        if found.entry in self._entries:
            self._entries.move_to_end(found.entry)
        return found

    def _get(self, key: Key) -> Entry | Replayed | None:
        found = self._entries.get(key)
        if found is None:
            return None
        self._entries.move_to_end(key)
        return found[0]

    def put(self, key: Key, entry: Entry | Replayed, nbytes: int) -> bool:
        """Hold ``entry`` (``nbytes``) under ``key``, evicting the least recently used
        entries until all fit; an entry larger than the whole cache is not held (False)."""
        if nbytes > self.max_bytes:
            return False
        self._remove(key)
        self._entries[key] = (entry, nbytes)
        self._keys[entry.model].add(key)
        self._bytes += nbytes
        while self._bytes > self.max_bytes:
            self._remove(next(iter(self._entries)))
        return True

    def drop(self, model: str) -> int:
        """Forget every entry of ``model`` (unloaded, or reloaded: its answers may change);
        how many there were."""
        keys = self._keys.pop(model, set())
        for key in keys:
            _, nbytes = self._entries.pop(key)
            self._bytes -= nbytes
        return len(keys)

    def _remove(self, key: Key) -> None:
        found = self._entries.pop(key, None)
        if found is None:
            return
        entry, nbytes = found
        self._bytes -= nbytes
        keys = self._keys[entry.model]
        keys.discard(key)
        if not keys:
            del self._keys[entry.model]


def request_key(model: str, generation: int, request: InferRequest) -> bytes:
    """The key of ``request``'s answer from ``model`` as loaded in ``generation`` (a reload
    is another): a 16-byte blake2b of every field that can change the answer.

    Not in it: the request's ``id`` (echoed, not computed) and :data:`SCHEDULING`'s
    parameters. Everything but the inputs' data goes in as one ``repr`` (unambiguous for
    str, int, float, bool and tuples of them: ``1``, ``1.0``, ``True`` and ``'1'`` differ),
    framed by its length; then each input's data, whose length that fixes (its shape and
    dtype), numeric data from its buffer (copied only if not contiguous), a BYTES element
    framed by its length.
    """
    parameters = request.parameters
    if parameters and not SCHEDULING.isdisjoint(parameters):
        parameters = {k: v for k, v in parameters.items() if k not in SCHEDULING}
    outputs = request.outputs
    described = repr(
        (
            model,
            generation,
            [
                (t.name, t.datatype, t.shape, t.data.dtype.str, _sorted(t.parameters))
                for t in request.inputs
            ],
            None
            if outputs is None
            else [(o.name, o.binary, _sorted(o.parameters)) for o in outputs],
            request.binary_data_output,
            _sorted(parameters),
        )
    ).encode("utf-8", "surrogatepass")
    h = hashlib.blake2b(len(described).to_bytes(8, "little"), digest_size=_KEY_BYTES)
    h.update(described)
    for tensor in request.inputs:
        _data(h, tensor.data)
    return h.digest()


def replay_key(model: str, generation: int, received: Sequence[bytes | None]) -> bytes:
    """The key of the answer to a request whose bytes, as they came (``received``: every
    part of the request its encoded answer depends on; None for one not sent, such as a
    header, which is not the same as one sent empty), were sent to ``model`` as loaded in
    ``generation``: a 16-byte blake2b of the generation, then the name and each part, framed
    by their lengths. Requests alike but for their encoding (JSON or binary, another ``id``)
    have different keys: their :func:`request_key` is what they share."""
    h = hashlib.blake2b(generation.to_bytes(8, "little"), digest_size=_KEY_BYTES, person=_REPLAY)
    for part in (model.encode("utf-8", "surrogatepass"), *received):
        if part is None:
            h.update(_ABSENT)
            continue
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()


def _sorted(parameters: Mapping[str, str | int | float | bool]) -> Any:
    return sorted(parameters.items()) if parameters else ()  # their order changes nothing


def _data(h: Any, data: np.ndarray[Any, Any]) -> None:
    if data.dtype != object:
        h.update(data if data.flags.c_contiguous else np.ascontiguousarray(data))
        return
    parts: list[bytes] = []
    for item in data.flat:  # each element framed by a tag and its length
        if isinstance(item, bytes):
            parts += (b"B", len(item).to_bytes(8, "little"), item)
        else:
            text = (item if isinstance(item, str) else repr(item)).encode("utf-8", "surrogatepass")
            tag = b"S" if isinstance(item, str) else b"R"
            parts += (tag, len(text).to_bytes(8, "little"), text)
    h.update(b"".join(parts))
