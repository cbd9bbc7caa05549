import pytest

from tuner.errors import BudgetError, ConfigError
from tuner.units import Deadline, format_duration, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("30m", 1800),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1h30m15s", 5415),
        ("45", 45),
        (" 2H ", 7200),
        ("1.5h", 5400),
    ],
)
def test_parse_duration_accepts_the_documented_forms(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2x", "h", "30m2h", "2 hours", "-5m", "0s", "1h-30m", "abc"])
def test_parse_duration_rejects_with_one_line(text):
    with pytest.raises(BudgetError) as err:
        parse_duration(text)
    assert "\n" not in str(err.value)
    assert "90s" in str(err.value)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("160MiB", 160 * 2**20),
        ("2GiB", 2 * 2**30),
        ("80GB", 80 * 10**9),
        ("1.5GiB", int(1.5 * 2**30)),
        ("4096", 4096),
        ("512 kib", 512 * 1024),
    ],
)
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["2GB?", "GiB", "-1GiB", "0MiB", "2 gigs", ""])
def test_parse_size_rejects(text):
    with pytest.raises(ConfigError) as err:
        parse_size(text)
    assert "160MiB" in str(err.value)


def test_deadline_on_a_fake_clock():
    now = [100.0]
    d = Deadline(60, clock=lambda: now[0])
    assert d.left == 60
    now[0] = 130.0
    assert d.left == 30 and d.elapsed == 30 and not d.expired()
    now[0] = 200.0
    assert d.left == 0 and d.expired()


def test_format_duration():
    assert format_duration(5415) == "1h30m"
    assert format_duration(95) == "1m35s"
    assert format_duration(7) == "7s"


def test_sizes_are_finite_whole_byte_counts_up_to_a_pib():
    """Issue 13: "1e400" was float infinity (OverflowError, a 500 from the API, a traceback from the CLI)."""
    from tuner.errors import LimitError
    from tuner.units import MAX_SIZE, parse_size

    assert parse_size("0.1KB") == 100 and parse_size("1.5GiB") == 3 * 2**29 and parse_size("2e8") == 200_000_000
    assert parse_size(MAX_SIZE) == MAX_SIZE
    for bad in ("1e400", "1e99999999999", 10**30, MAX_SIZE + 1, "1.5B"):
        with pytest.raises(LimitError, match="memory size"):
            parse_size(bad)


def test_fractional_sizes_round_down_to_whole_bytes():
    """Issue 21: the team's OOM message says "79.15 GiB"; the parser refused it (not a whole number of bytes)."""
    from tuner.errors import LimitError

    assert parse_size("79.15GiB") == 84_986_665_369  # 79.15 * 2**30 = 84,986,665,369.6, rounded down
    assert parse_size("79.15 GiB") == parse_size("79.15GiB")
    assert parse_size("0.001KiB") == 1  # 1.024 bytes
    for bad in ("1.5B", "0.0001KiB"):  # a bare byte count stays whole; under one byte is no size
        with pytest.raises(LimitError, match="memory size"):
            parse_size(bad)


def test_a_device_memory_without_a_unit_is_refused_naming_the_forms() -> None:
    from tuner.units import parse_memory

    assert parse_memory("80GiB") == 80 * 2**30 and parse_memory("80GB") == 80 * 10**9 and parse_memory(160) == 160
    for bare in ("160", "80", " 2e8 "):
        with pytest.raises(ConfigError, match=r"has no unit; write it like 160MiB, 80GiB or 80GB"):
            parse_memory(bare)
