"""Answers to AdmissionReviews that repeat, byte for byte, all but ``request.uid``.

kube-apiserver writes the pods one ReplicaSet or Job creates into reviews that differ only in the request's
uid (the pods' names are generated after admission). Such a review needs no decoding, rendering or encoding:
its answer is the one given to the first, with its own uid spliced in. ``webhook.memo`` saves the rendering
for these pods; this saves the rest of the work (reading the review, the memo's key, encoding the answer),
about half of a review's CPU in the served process.

Why a replayed answer is exact. When an answer is remembered, the review's uid must occur exactly once in
its bytes, consist of ASCII letters, digits and dashes only (one letter or digit at least), and be the value
that decoding puts in ``request.uid``: decoding the same bytes with another such string in that slot must
give the same document but for ``request.uid`` (checked, with orjson, once per remembered review). A later
review with the same bytes outside the slot and such a string inside it then decodes to the remembered
document with its own ``request.uid``, and the decision never reads the uid but to echo it. Everything else
a decision reads beside the review is part of the context that must match: the cluster view's generation,
the Karpenter do-not-disrupt switch, the owner object the workload label came from, and the pod index when
the decision used one (answers are kept per index; a new index decides afresh).

A review is remembered on its second sighting: the first only notes a hash of its bytes outside the slot
(a bounded set), so pods that never repeat (a StatefulSet's, say: their names differ) cost a lookup, not
the check. Memory is bounded by a byte budget over all entries (review bytes plus answer bytes), least
recently used out first, and by the number of reviews noted once. Not thread-safe: the server uses it from
its event loop only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import orjson

from webhook.admission import Outcome

DEFAULT_BUDGET_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_REVIEW_BYTES = 64 * 1024  # larger reviews are never remembered
MAX_LAYOUTS = 4  # (offset, length) of the uid slot: kube-apiserver's reviews put it at one place
MAX_SEEN_ONCE = 4096  # reviews noted on their first sighting (a hash each)

LayoutKey = tuple[int, int, bytes]  # uid offset, uid length, the review's bytes without the uid


@dataclass(slots=True)
class Replay:
    """What a remembered review's decision was, for the server's metrics and log line."""

    uid: str
    answer: bytes
    outcome: Outcome
    reason: str | None
    note: Any  # what the caller remembered beside the answer (the server: its log line's fields, rendered)


@dataclass
class _Entry:
    owner: Hashable  # the owner the workload label came from (webhook.owners.OwnerKey), or None
    context: Hashable
    outcome: Outcome
    reason: str | None
    note: Any
    uses_index: bool
    answers: dict[int | None, tuple[bytes, bytes]] = field(default_factory=dict)  # by index: around the uid
    size: int = 0


def _safe_uid(uid: bytes) -> bool:
    """Letters, digits and dashes, at least one letter or digit (``isalnum`` is ASCII-only for bytes)."""
    return uid.replace(b"-", b"").isalnum()


class ReviewReplay:
    def __init__(self, *, budget_bytes: int = DEFAULT_BUDGET_BYTES,
                 max_review_bytes: int = DEFAULT_MAX_REVIEW_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self.max_review_bytes = max_review_bytes
        self._layouts: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._entries: OrderedDict[LayoutKey, _Entry] = OrderedDict()
        self._seen_once: OrderedDict[int, None] = OrderedDict()  # hashes of the keys seen once
        self._bytes = 0
        self.hits = 0
        # the key, size and bytes around the uid of the review found last
        self._last: tuple[LayoutKey, int, bytes, bytes] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def answer(self, body: bytes, context_of: Callable[[Hashable], Hashable],
               draw_index: Callable[[], int]) -> Replay | None:
        """The answer for ``body``, if a review with its bytes outside the uid slot was remembered under the
        context ``context_of`` gives now for that review's owner and, when its decision used a pod index,
        for the index ``draw_index`` gives (called only then)."""
        if len(body) > self.max_review_bytes:
            return None
        found = self._find(body)
        if found is None:
            return None
        key, entry, offset, end = found
        uid = body[offset:end]
        if not _safe_uid(uid) or entry.context != context_of(entry.owner):
            return None
        parts = entry.answers.get(draw_index() if entry.uses_index else None)
        if parts is None:
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return Replay(uid.decode(), parts[0] + uid + parts[1], entry.outcome, entry.reason, entry.note)

    def _find(self, body: bytes) -> tuple[LayoutKey, _Entry, int, int] | None:
        """The entry whose review is ``body`` but for the uid slot, with its key and the slot."""
        last = self._last  # the review found last: the next (a ReplicaSet's next pod) is compared, not hashed
        if last is not None:
            key, size, head, tail = last
            if len(body) == size and body.startswith(head) and body.endswith(tail):
                entry = self._entries.get(key)
                if entry is not None:
                    return key, entry, key[0], key[0] + key[1]
        for offset, length in self._layouts:
            end = offset + length
            if end >= len(body):
                continue
            head, tail = body[:offset], body[end:]
            key = (offset, length, head + tail)
            entry = self._entries.get(key)
            if entry is not None:
                self._last = (key, len(body), head, tail)
                return key, entry, offset, end
        return None

    def remember(self, body: bytes, uid: str, answer: bytes, *, owner: Hashable, context: Hashable,
                 index: int | None, outcome: Outcome, reason: str | None, note: Any = None) -> bool:
        """Keep ``answer`` (the encoded review answering ``body``, whose request uid is ``uid``) for the
        reviews that differ from ``body`` only in the uid. ``owner``: the owner the decision read, and
        ``context`` what ``answer``'s ``context_of(owner)`` gave for it; ``index``: the pod index the decision
        used, None when it used none; ``note``: anything to hand back with each replayed answer (the same for
        every index). False when the review cannot be replayed exactly (nothing is kept)."""
        encoded_uid = uid.encode()
        if len(body) > self.max_review_bytes or not _safe_uid(encoded_uid):
            return False
        offset = body.find(encoded_uid)
        if offset < 0 or body.find(encoded_uid, offset + 1) >= 0:
            return False
        end = offset + len(encoded_uid)
        at = answer.find(encoded_uid)
        if at < 0 or answer.find(encoded_uid, at + 1) >= 0:
            return False
        key = (offset, len(encoded_uid), body[:offset] + body[end:])
        entry = self._entries.get(key)
        if (entry is None or entry.owner != owner or entry.context != context
                or entry.uses_index != (index is not None)):
            if entry is None:
                noted = hash(key)  # a collision costs one needless check, never a wrong answer
                if noted not in self._seen_once:  # the first sighting: noted only
                    self._seen_once[noted] = None
                    if len(self._seen_once) > MAX_SEEN_ONCE:
                        self._seen_once.popitem(last=False)
                    return False
                del self._seen_once[noted]
            if not _slot_is_request_uid(body, offset, end, uid):
                return False
            self._drop(key)
            entry = _Entry(owner, context, outcome, reason, note, index is not None)
            entry.size = len(key[2])
            self._entries[key] = entry
            self._bytes += entry.size
        elif index in entry.answers:
            return True
        parts = (answer[:at], answer[at + len(encoded_uid):])
        entry.answers[index] = parts
        size = len(parts[0]) + len(parts[1])
        entry.size += size
        self._bytes += size
        self._entries.move_to_end(key)
        self._layouts[(offset, len(encoded_uid))] = None
        self._layouts.move_to_end((offset, len(encoded_uid)), last=False)
        while len(self._layouts) > MAX_LAYOUTS:
            self._layouts.popitem()
        while self._bytes > self.budget_bytes and self._entries:
            self._drop(next(iter(self._entries)))
        return key in self._entries

    def _drop(self, key: LayoutKey) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry.size


def _slot_is_request_uid(body: bytes, offset: int, end: int, uid: str) -> bool:
    """Whether the bytes ``body[offset:end]`` are exactly where decoding takes ``request.uid`` from: with
    another uid there, the document decodes the same but for ``request.uid``."""
    other = ("a" if uid[0] != "a" else "b") * (end - offset)
    try:
        original = orjson.loads(body)
        changed = orjson.loads(body[:offset] + other.encode() + body[end:])
    except orjson.JSONDecodeError:
        return False
    request = changed.get("request") if isinstance(changed, dict) else None
    if not isinstance(request, dict) or request.get("uid") != other:
        return False
    request["uid"] = uid
    return bool(changed == original)
