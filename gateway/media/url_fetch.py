"""SSRF-safe fetching of image URLs.

Contract of `UrlFetcher.fetch(url)`: it returns the response body (at most `max_image_bytes`
bytes) of an http(s) URL, or raises `APIError` (4xx, `param` None: the caller fills it in).

How a request is kept on the public internet (unless `allow_private_urls`):

- only http and https; the host must be in `allowed_url_hosts` when that list is non-empty;
- the host is resolved ONCE per hop (IP literals, including odd spellings such as `127.1`,
  `2130706433` or `0x7f.1`, are parsed and never resolved); if ANY address is refused by the
  address policy the URL is refused;
- the connection goes to the address that was checked: a per-fetch network backend maps the
  hostname to that pinned address, while the Host header and TLS SNI keep the hostname. The
  backend refuses to connect to any host it has no pin for, so no second DNS lookup can happen;
- redirects are followed by hand, at most `max_redirects`, and every hop is checked again;
- connect/read timeouts from the config plus an overall deadline for the whole fetch;
- the byte cap is checked against Content-Length and again while streaming.

Environment proxies (HTTP_PROXY, ...) are ignored: a proxy would connect on our behalf to an
address we never checked.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from collections.abc import Callable

import httpcore
import httpx

from gateway.config import MediaConfig
from gateway.errors import APIError, invalid, too_large
from gateway.media.single_flight import SingleFlight
from gateway.media.url_policy import (
    AddressPolicy,
    IPAddress,
    PinnedBackend,
    PinnedTransport,
    Resolver,
    forbidden_address_reason,
    parse_ip_literal,
    shared_ssl_context,
    shorten,
    system_resolver,
)

TransportFactory = Callable[[httpcore.AsyncNetworkBackend], httpx.AsyncBaseTransport]
"""Builds the transport for one fetch from the pinned network backend it must connect with."""

FORBIDDEN_CODE = "image_url_forbidden"
FAILED_CODE = "image_fetch_failed"
TIMEOUT_CODE = "image_fetch_timeout"
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_PRIVATE_HINT = "start the server with --allow-private-urls to allow it"


class UrlFetcher:
    """Fetches image bytes from http(s) URLs with the SSRF rules of the module docstring.

    Concurrent fetches of the same URL string share one request. Bound to the event loop it is
    first used on; not thread-safe. `address_policy` replaces `forbidden_address_reason` (tests
    use it to treat some loopback addresses as private); `allow_private_urls` disables it.
    `total_timeout_s` (default connect + read timeout) bounds DNS, every hop and the body.
    """

    def __init__(
        self,
        config: MediaConfig,
        *,
        resolver: Resolver | None = None,
        transport_factory: TransportFactory | None = None,
        address_policy: AddressPolicy | None = None,
        total_timeout_s: float | None = None,
        kind: str = "image",
    ) -> None:
        """`kind` "video": the cap is `max_video_bytes` and messages say "video URL"."""
        self._config = config
        self._kind = kind
        caps = {"video": config.max_video_bytes, "audio": config.max_audio_bytes}
        self._cap = caps.get(kind, config.max_image_bytes)
        self._resolver = resolver or system_resolver
        self._transport_factory = transport_factory
        self._policy = address_policy or forbidden_address_reason
        self._total_timeout_s = total_timeout_s or (
            config.connect_timeout_s + config.read_timeout_s
        )
        self._timeout = httpx.Timeout(
            connect=config.connect_timeout_s,
            read=config.read_timeout_s,
            write=config.read_timeout_s,
            pool=config.connect_timeout_s,
        )
        self._ssl_context: ssl.SSLContext | None = None
        self._inflight: SingleFlight[str, bytes] = SingleFlight()
        self._counts = dict(refused=0, failed=0, bytes=0, resolutions=0)

    def stats(self) -> dict[str, int]:
        """Counters: fetches started, joined (deduplicated), refused, failed, bytes, resolutions."""
        flights = self._inflight
        return dict(self._counts, fetches=flights.started, joined=flights.joined)

    async def aclose(self) -> None:
        """Cancel in-flight fetches (their waiters see CancelledError) and wait for them."""
        await self._inflight.cancel_all()

    async def fetch(self, url: str) -> bytes:
        """The body of `url`; APIError (param None) on any refusal or failure."""
        return await self._inflight.run(url, lambda: self._fetch_with_deadline(url))

    async def _fetch_with_deadline(self, url: str) -> bytes:
        try:
            return await asyncio.wait_for(self._fetch_hops(url), self._total_timeout_s)
        except APIError as err:
            self._counts["refused" if err.code == FORBIDDEN_CODE else "failed"] += 1
            raise
        except TimeoutError:
            self._counts["failed"] += 1
            raise invalid(
                f"{self._kind} URL {shorten(url)} did not finish within "
                f"{self._total_timeout_s:g} s (the server's --url-connect-timeout + "
                "--url-read-timeout)",
                code=TIMEOUT_CODE,
            ) from None

    async def _fetch_hops(self, url: str) -> bytes:
        backend = PinnedBackend()
        if self._transport_factory is not None:
            transport = self._transport_factory(backend)
        else:
            transport = PinnedTransport(backend, await self._get_ssl_context())
        headers = {"Accept": f"{self._kind}/*", "Accept-Encoding": "identity"}
        async with httpx.AsyncClient(
            transport=transport,
            trust_env=False,
            follow_redirects=False,
            timeout=self._timeout,
            headers={"User-Agent": "vision-gateway", **headers},
        ) as client:
            current = url
            for hop in range(self._config.max_redirects + 1):
                target, host, port, subject = self._check_url(current, url, hop)
                backend.pin(host, port, await self._resolve_checked(host, port, subject))
                try:
                    async with client.stream("GET", target) as response:
                        location = response.headers.get("location")
                        if response.status_code in _REDIRECT_STATUSES and location:
                            current = str(target.join(location))
                            continue
                        if not 200 <= response.status_code < 300:
                            raise invalid(
                                f"{self._kind} URL {shorten(url)} returned HTTP status "
                                f"{response.status_code}",
                                code=FAILED_CODE,
                            )
                        return await self._read_capped(response, url)
                except httpx.TimeoutException as exc:
                    raise self._timeout_error(exc, url) from exc
                except (httpx.HTTPError, httpx.InvalidURL) as exc:
                    raise invalid(
                        f"could not fetch image URL {shorten(url)}: {type(exc).__name__}: "
                        f"{shorten(str(exc) or 'no details', 200)}",
                        code=FAILED_CODE,
                    ) from exc
        raise invalid(
            f"{self._kind} URL {shorten(url)} redirected more than "
            f"{self._config.max_redirects} times "
            "(the limit is set by --max-redirects)",
            code=FAILED_CODE,
        )

    def _timeout_error(self, exc: httpx.TimeoutException, url: str) -> APIError:
        if isinstance(exc, httpx.ConnectTimeout | httpx.PoolTimeout):
            what = (
                f"did not accept a connection within {self._config.connect_timeout_s:g} s "
                "(the server's --url-connect-timeout)"
            )
        else:
            what = (
                f"did not answer within {self._config.read_timeout_s:g} s "
                "(the server's --url-read-timeout)"
            )
        return invalid(f"{self._kind} URL {shorten(url)} {what}", code=TIMEOUT_CODE)

    def _check_url(self, current: str, original: str, hop: int) -> tuple[httpx.URL, str, int, str]:
        """Parse and check scheme and host.

        Returns (url, host as httpcore will see it, port, subject for error messages).
        """
        where = f"{self._kind} URL {shorten(original)}"
        if hop:
            where = f"the redirect from {where} to {shorten(current)}"
        try:
            target = httpx.URL(current)
            host = target.raw_host.decode("ascii").lower()
        except (httpx.InvalidURL, ValueError, TypeError, UnicodeError) as exc:
            raise invalid(f"{where} is not a valid URL: {exc}", code="invalid_image_url") from None
        if target.scheme not in ("http", "https"):
            raise invalid(
                f"{where} uses the unsupported scheme {target.scheme!r}; only http and https "
                "URLs are fetched",
                code=FORBIDDEN_CODE if hop else "unsupported_image_source",
            )
        if not host:
            raise invalid(f"{where} has no host", code="invalid_image_url")
        allowed = self._config.allowed_url_hosts
        if allowed and host.strip("[]").rstrip(".") not in allowed:
            raise invalid(
                f"{where} has host {host!r}, which is not in the allowed hosts "
                "(--allowed-url-host)",
                code=FORBIDDEN_CODE,
            )
        return target, host, target.port or (443 if target.scheme == "https" else 80), where

    async def _resolve_checked(self, host: str, port: int, subject: str) -> str:
        """The one address to connect to, after checking every address `host` denotes."""
        literal = parse_ip_literal(host)
        if literal is not None:
            addresses: list[IPAddress] = [literal]
        else:
            self._counts["resolutions"] += 1
            try:
                raw = await self._resolver(host, port)
                addresses = [ipaddress.ip_address(a) for a in raw]
            except (OSError, UnicodeError, ValueError) as exc:
                raise invalid(
                    f"could not resolve the host of {subject}: {exc}",
                    code=FAILED_CODE,
                ) from None
            if not addresses:
                raise invalid(f"the host of {subject} has no addresses", code=FAILED_CODE)
        if not self._config.allow_private_urls:
            for address in addresses:
                reason = self._policy(address)
                if reason:
                    what = f"host {host} is" if literal is not None else f"host {host} resolves to"
                    raise invalid(
                        f"{subject} was refused: {what} a {reason} address; {self._kind} "
                        f"URLs must point to public hosts ({_PRIVATE_HINT})",
                        code=FORBIDDEN_CODE,
                    )
        return str(addresses[0])

    async def _read_capped(self, response: httpx.Response, url: str) -> bytes:
        cap = self._cap
        over = (
            f"{self._kind} URL {shorten(url)} sent more than {cap} bytes, over the per-"
            f"{self._kind} limit (--max-{self._kind}-bytes)"
        )
        length = response.headers.get("content-length", "")
        if length.strip().isdigit() and int(length) > cap:
            raise too_large(over)  # refuse before reading any of the body
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            # We asked for identity; decompressing would let a tiny body expand past the cap.
            raise invalid(
                f"{self._kind} URL {shorten(url)} sent a compressed body ({encoding}); "
                f"{self._kind} URLs must be served without Content-Encoding",
                code=FAILED_CODE,
            )
        body = bytearray()
        async for chunk in response.aiter_raw():
            body += chunk
            if len(body) > cap:
                raise too_large(over)
        self._counts["bytes"] += len(body)
        return bytes(body)

    async def _get_ssl_context(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            # Loading the CA bundle takes ~0.1 s of blocking work: off the loop, once a process.
            self._ssl_context = await asyncio.to_thread(shared_ssl_context)
        return self._ssl_context
