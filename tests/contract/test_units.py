import pytest

from kvcore import InvalidInputError, format_bytes, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24GiB", 24 * 2**30),
        ("24gib", 24 * 2**30),
        ("500MB", 500 * 10**6),
        ("1.5G", 3 * 2**29),
        ("1073741824", 2**30),
        ("80 GiB", 80 * 2**30),
        ("1e9", 10**9),
        ("2TB", 2 * 10**12),
        (4096, 4096),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "-1GiB", "12 parsecs", "1..5G", True, -3])
def test_parse_size_rejects(text):
    with pytest.raises(InvalidInputError):
        parse_size(text)


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(3 * 2**30) == "3.00 GiB"
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(5 * 2**40) == "5.00 TiB"
