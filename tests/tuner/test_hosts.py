"""tuner.hosts: the Host allow-list's parsing, defaults and matching (pure)."""

from __future__ import annotations

import pytest

from tuner.errors import ConfigError
from tuner.hosts import answered_hosts, host_allowed, host_of, is_loopback, parse_allowed_hosts, serve_default


def test_host_of_drops_the_port_and_brackets() -> None:
    assert [host_of(h) for h in ("A.example:80", "[::1]:8000", "::1", "127.0.0.1", "x.example.")] == [
        "a.example",
        "::1",
        "::1",
        "127.0.0.1",
        "x.example",
    ]


def test_parse_normalises_and_names_a_bad_entry() -> None:
    assert parse_allowed_hosts(" Tuner.Internal , [::1], *.corp.example,10.0.0.5") == (
        "tuner.internal",
        "::1",
        "*.corp.example",
        "10.0.0.5",
    )
    for bad in ("", "a,,b", "http://a", "a/b", "*a.example", "a..b b", "-a"):
        with pytest.raises(ConfigError, match="allowed host"):
            parse_allowed_hosts(bad)


def test_defaults_by_bind() -> None:
    assert serve_default("127.0.0.1") == "localhost,127.0.0.1,::1"
    assert serve_default("127.0.0.2") == "localhost,127.0.0.1,::1,127.0.0.2"
    assert serve_default("[::1]") == "localhost,127.0.0.1,::1"
    assert serve_default("0.0.0.0") is None and serve_default("gpu1.corp.example") is None
    assert answered_hosts(None) is None and answered_hosts("a.example,*") is None
    assert is_loopback("localhost") and is_loopback("[::1]") and not is_loopback("10.0.0.1")


def test_matching() -> None:
    allowed = parse_allowed_hosts("tuner.internal,*.corp.example,::1")
    assert host_allowed("tuner.internal:8000", allowed) and host_allowed("[::1]:1", allowed)
    assert host_allowed("a.b.corp.example", allowed) and not host_allowed("corp.example", allowed)
    assert not host_allowed("evilcorp.example", allowed) and not host_allowed("tuner.internal.evil", allowed)
    assert not host_allowed(None, allowed) and not host_allowed("", allowed)
    assert host_allowed(None, None) and host_allowed("anything", None)
