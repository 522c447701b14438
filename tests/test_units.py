from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parlab.units import format_bytes, parse_size


@pytest.mark.parametrize(
    "text, expected",
    [
        ("8", 8),
        ("64KiB", 65536),
        ("1MB", 10**6),
        ("8G", 8 * 1024**3),
        ("1.5GiB", 3 * 1024**3 // 2),
        (" 2 mib ", 2 * 1024**2),
        (4096, 4096),
    ],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "1.5", "8 parsecs", "-1", "1e3"])
def test_parse_size_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


@given(st.integers(min_value=0, max_value=2**50))
def test_parse_size_round_trips_bytes(n: int) -> None:
    assert parse_size(str(n)) == n
    assert parse_size(f"{n}B") == n


def test_format_bytes() -> None:
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 1024**3) == "3.00 GiB"
