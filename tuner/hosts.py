"""Which Host headers the service answers (DNS rebinding). A page on evil.example whose name an attacker re-points at
127.0.0.1 reaches a loopback `tuner serve` from the user's browser with ``Host: evil.example``; refusing Host names the
operator did not list closes that door. Pure functions: api/guard.py applies them to each request, `tuner serve`
fills in the default.

``TUNER_ALLOWED_HOSTS`` / ``tuner serve --allowed-hosts`` is a comma-separated list: exact names or addresses
(``tuner.internal``, ``10.0.0.5``, ``::1``), ``*.example.com`` (any name under example.com) or ``*`` (any Host). Unset,
a loopback bind answers the loopback names only and any other bind answers any Host (it needs a token for writes, and
`tuner serve` says that the list is open)."""

from __future__ import annotations

import ipaddress
import re

from tuner.errors import ConfigError

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")  # what a browser or curl on the host sends for a loopback bind
ANY = "*"
_NAME = re.compile(r"^(\*\.)?[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$")


def is_loopback(host: str) -> bool:
    """A loopback name or address (127.0.0.0/8, ::1), bracketed or not."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_allowed_hosts(raw: str) -> tuple[str, ...]:
    """``a.example,*.corp,10.0.0.5`` -> its entries, lower-cased; ConfigError (one line) naming a bad entry."""
    entries = tuple(e.strip().lower() for e in raw.split(","))
    for entry in entries:
        if entry == ANY:
            continue
        if not entry or not (_NAME.match(entry) or _is_ip(entry)):
            raise ConfigError(
                f"allowed host {entry!r} is not a host name, an IP address, '*.domain' or '*': "
                "give a comma-separated list such as tuner.internal,10.0.0.5"
            )
    return tuple(e.strip("[]") if _is_ip(e) else e for e in entries)


def answered_hosts(allowed: str | None) -> tuple[str, ...] | None:
    """The Host names the app answers under the setting; None (unset, or ``*`` listed): any."""
    if allowed is None:
        return None
    entries = parse_allowed_hosts(allowed)
    return None if ANY in entries else entries


def serve_default(bind: str) -> str | None:
    """What `tuner serve` answers when the list is unset: on a loopback bind the loopback names (and the bind address
    itself, 127.0.0.2 say); elsewhere None (any Host: the operator's proxy or DNS name is not known here)."""
    if not is_loopback(bind):
        return None
    own = bind.strip("[]").lower()
    return ",".join(LOOPBACK_HOSTS if own in LOOPBACK_HOSTS else (*LOOPBACK_HOSTS, own))


def host_of(header: str) -> str:
    """The name in a Host header, without its port: ``[::1]:8000`` -> ``::1``, ``a.example:80`` -> ``a.example``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    if header.count(":") > 1:  # a bare IPv6 address, no port
        return header
    return header.split(":", 1)[0].rstrip(".")


def host_allowed(header: str | None, allowed: tuple[str, ...] | None) -> bool:
    """Whether a request with this Host header (None: none sent) is answered under ``allowed``."""
    if allowed is None:
        return True
    if not header:
        return False
    name = host_of(header)
    for entry in allowed:
        if entry == name or (entry.startswith("*.") and name.endswith(entry[1:]) and len(name) > len(entry) - 1):
            return True
    return False


def _is_ip(entry: str) -> bool:
    try:
        ipaddress.ip_address(entry.strip("[]"))
    except ValueError:
        return False
    return True
