"""``BinaryNotText`` counts control characters on the raw bytes: the same count, and so the same
verdict, as counting the characters of the decoded sample, on hostile bytes (truncated and invalid
UTF-8 sequences around control bytes, mostly-control bodies, the 64 KiB sample edge)."""

from __future__ import annotations

import random

import pytest

from mcpsync.activities.guardrails import CONTROL_BYTES, BinaryNotText
from mcpsync.workflows.digest import ContentPart


def _by_characters(data: bytes) -> tuple[int, int]:
    """The sample's control characters and length, counted on its decoded characters."""
    sample = data[:65536].decode("utf-8", errors="replace")
    return sum(1 for c in sample if ord(c) < 32 and c not in "\t\n\r\f"), len(sample)


def _by_bytes(data: bytes) -> int:
    raw = data[:65536]
    return len(raw) - len(raw.translate(None, CONTROL_BYTES))


HOSTILE = [
    b"plain text\n\twith tabs\r\n",
    b"\xe2\x01\x02",  # a truncated 3-byte sequence, then control bytes
    b"\xf0\x9f\x98\x01\xc3\x02",  # a 4-byte sequence cut by a control byte, then a cut 2-byte one
    b"\xff\xfe\x1b[31m" * 10,  # invalid bytes and escape sequences
    "caf\u00e9 \u2603 \U0001f600".encode() + b"\x07" * 3,
    b"\x01" * 70_000,  # past the sample: only 64 KiB counted
    b"x" * 65_535 + "\u00e9".encode() + b"\x01" * 10,  # a sequence cut by the sample's end
]


@pytest.mark.parametrize("data", HOSTILE)
def test_control_bytes_are_the_samples_control_characters(data: bytes) -> None:
    assert _by_bytes(data) == _by_characters(data)[0]


def test_random_bytes_count_alike_and_judge_alike() -> None:
    rng = random.Random(46)
    guard = BinaryNotText()
    alphabet = bytes(range(1, 256))  # no NUL: that is rejected before the count
    for _ in range(300):
        n = rng.choice([1, 7, 64, 500, 4096])
        data = bytes(rng.choice(alphabet) for _ in range(n))
        controls, length = _by_characters(data)
        assert _by_bytes(data) == controls
        rejected = guard.check([ContentPart("text", "text/plain", data)]) is not None
        assert rejected == (controls / max(1, length) > guard.max_control_ratio)
