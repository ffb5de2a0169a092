"""Which addresses an image URL may reach, how hosts become addresses, and the network
backend that holds each connection to the address that was checked.

The functions are pure (thread-safe) apart from the default async resolver. The fetcher in
`gateway.media.url_fetch` applies them to every hop of every fetch.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
import re
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import httpcore
import httpx

log = logging.getLogger(__name__)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]
"""(host, port) -> IP address strings. Raise OSError when the name does not resolve."""
AddressPolicy = Callable[[IPAddress], "str | None"]
"""An address -> None when it may be contacted, else a short reason ("loopback", ...)."""

# Hosts that may be a numeric IPv4 spelling which inet_aton accepts (127.1, 0x7f.1, 2130706433).
_NUMERIC_HOST = re.compile(r"^[0-9a-fA-FxX.]+$")


def shorten(text: str, limit: int = 120) -> str:
    """`text` cut to `limit` characters for error messages (URLs can be huge)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_ip_literal(host: str) -> IPAddress | None:
    """The address a URL host denotes literally, or None when it is a name to resolve.

    Accepts every spelling the C library would connect to: dotted quads, IPv6 (with
    IPv4-mapped forms and scope ids), and inet_aton's short/octal/hex/decimal IPv4 forms.
    """
    host = host.strip("[]").rstrip(".")
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if host and _NUMERIC_HOST.match(host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def forbidden_address_reason(ip: IPAddress) -> str | None:
    """Default policy: refuse anything that is not a public unicast address.

    IPv6 forms that embed an IPv4 address (IPv4-mapped, 6to4, NAT64 64:ff9b::/96) are judged
    by the embedded address too, since a dual-stack or translating path would reach it.
    """
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = [ip.ipv4_mapped, ip.sixtofour]
        if ip in ipaddress.IPv6Network("64:ff9b::/96"):
            embedded.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
        for v4 in embedded:
            if v4 is not None and (reason := forbidden_address_reason(v4)):
                return reason
    for reason, flagged in (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
        ("reserved", ip.is_reserved),
        ("non-public", not ip.is_global),
    ):
        if flagged:
            return reason
    return None


async def system_resolver(host: str, port: int) -> list[str]:
    """Resolve with the system resolver (getaddrinfo in the loop's executor)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """A network backend that connects only to pinned (host, port) -> address mappings.

    One instance serves one fetch (its hops run one after another), so pins need no lock.
    httpcore still uses the hostname for TLS SNI and certificate checks.
    """

    def __init__(self, inner: httpcore.AsyncNetworkBackend | None = None) -> None:
        self._inner = inner or httpcore.AnyIOBackend()
        self._pins: dict[tuple[str, int], str] = {}

    def pin(self, host: str, port: int, address: str) -> None:
        self._pins[(host.lower(), port)] = address

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        address = self._pins.get((host.lower(), port))
        if address is None:
            # Only reachable through a bug (a hop that skipped the check): fail closed.
            log.error("refusing unpinned connection to %s:%s", host, port)
            raise httpcore.ConnectError(f"refusing to connect to unchecked host {host}:{port}")
        return await self._inner.connect_tcp(address, port, timeout, local_address, socket_options)

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not used for image URLs")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class PinnedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport with its connection pool swapped for one on a `PinnedBackend`."""

    def __init__(self, backend: PinnedBackend, ssl_context: ssl.SSLContext) -> None:
        super().__init__(verify=ssl_context, trust_env=False)
        # httpx offers no public hook for the network backend; fail loudly if that changes
        # rather than silently connecting without pins.
        if not isinstance(self._pool, httpcore.AsyncConnectionPool):
            raise RuntimeError("unexpected httpx transport internals; cannot pin addresses")
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context, max_connections=4, network_backend=backend
        )


@functools.cache
def shared_ssl_context() -> ssl.SSLContext:
    """Verifying client context with certifi's CAs; shared (SSLContext is thread-safe)."""
    return httpx.create_ssl_context(trust_env=False)
