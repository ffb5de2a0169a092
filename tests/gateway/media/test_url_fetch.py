"""Invariants of gateway.media.url_fetch: image URLs cannot reach loopback/private addresses
(however spelled, however resolved, however redirected), the checked address is the one
connected to, limits (bytes, redirects, time) hold, and concurrent fetches of one URL are done once.

Network rule: every request goes to a server the test starts on 127.0.0.1 / 127.0.0.2; names
are resolved by fake resolvers only, and `socket.getaddrinfo` refuses names outright.
"""

from __future__ import annotations

import asyncio
import datetime
import io
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from PIL import Image

from gateway.config import MediaConfig
from gateway.errors import APIError
from gateway.media import MediaLoader
from gateway.media.url_fetch import FORBIDDEN_CODE, TIMEOUT_CODE, UrlFetcher
from gateway.media.url_policy import forbidden_address_reason, parse_ip_literal

Handler = Callable[[BaseHTTPRequestHandler], None]


def png_bytes(color: tuple[int, int, int] = (200, 30, 60), size: tuple[int, int] = (6, 5)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, "PNG")
    return buf.getvalue()


PNG = png_bytes()


@pytest.fixture(autouse=True)
def no_real_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any name lookup other than of a numeric address fails: tests must use fake resolvers."""
    real = socket.getaddrinfo

    def guarded(host, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            ipaddress.ip_address(host.decode() if isinstance(host, bytes) else host)
        except (ValueError, AttributeError):
            msg = f"real DNS lookup of {host!r} in a test"
            raise socket.gaierror(socket.EAI_NONAME, msg) from None
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", guarded)


class Server:
    """A threaded HTTP server on a loopback address; records (path, Host header) per request."""

    def __init__(self, routes: dict[str, Handler], host: str = "127.0.0.1") -> None:
        self.routes = routes
        self.hits: list[tuple[str, str]] = []
        self.stop = threading.Event()
        server = self

        class _Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                server.hits.append((self.path, self.headers.get("Host", "")))
                route = server.routes.get(self.path)
                if route is None:
                    self.send_error(404)
                    return
                try:
                    route(self)
                except OSError:
                    pass  # the client hung up: expected in the cap/timeout tests

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer((host, 0), _Handler)
        self.httpd.daemon_threads = True
        self.host = host
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    def url(self, path: str, host: str | None = None) -> str:
        return f"http://{host or self.host}:{self.port}{path}"

    def __enter__(self) -> Server:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def send(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> Handler:
    def handler(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        for k, v in (headers or {"Content-Length": str(len(body))}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)

    return handler


def redirect(location: Callable[[], str] | str, status: int = 302) -> Handler:
    def handler(h: BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Location", location() if callable(location) else location)
        h.send_header("Content-Length", "0")
        h.end_headers()

    return handler


class FakeResolver:
    """Maps names to address lists (a list of answers per name is served in turn)."""

    def __init__(self, table: dict[str, list[list[str]]]) -> None:
        self.table = table
        self.calls: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append(host)
        answers = self.table.get(host.rstrip("."))
        if not answers:
            raise OSError(f"fake resolver: unknown host {host}")
        return answers.pop(0) if len(answers) > 1 else answers[0]


def only_127_0_0_2_is_private(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Test policy: 127.0.0.1 plays a public host, 127.0.0.2 an internal one."""
    return "private (test)" if ip == ipaddress.ip_address("127.0.0.2") else None


def load_error(loader: MediaLoader, url: str, param: str = "p") -> APIError:
    async def go() -> APIError:
        try:
            await loader.load(url, param)
        except APIError as err:
            return err
        finally:
            await loader.aclose()
        raise AssertionError(f"{url} loaded")

    return asyncio.run(go())


def no_transport(requests: list[httpx.Request]) -> Callable[[object], httpx.AsyncBaseTransport]:
    """A transport factory that records requests instead of connecting anywhere."""

    def factory(_backend: object) -> httpx.AsyncBaseTransport:
        def handler(request: httpx.Request) -> httpx.Response:
            requests.append(request)
            return httpx.Response(200, content=PNG)

        return httpx.MockTransport(handler)

    return factory


# --- address policy -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host, expected",
    [
        ("127.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("127.0.0.1.", "127.0.0.1"),
        ("0.0.0.0", "0.0.0.0"),
        ("[::]", "::"),
        ("::ffff:127.0.0.1", "::ffff:7f00:1"),
        ("example.com", None),
        ("deadbeef.cafe", None),
        ("999.1.1.1", None),
    ],
)
def test_odd_ip_literal_spellings_are_parsed_as_addresses(host: str, expected: str | None) -> None:
    parsed = parse_ip_literal(host)
    assert (str(parsed) if parsed else None) == expected


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.0.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "255.255.255.255",
        "198.18.0.1",
        "::1",
        "::",
        "fe80::1",
        "fc00::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "64:ff9b::a00:1",
        "2002:7f00:1::1",
    ],
)
def test_default_policy_refuses_non_public_addresses(address: str) -> None:
    assert forbidden_address_reason(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize("address", ["8.8.8.8", "93.184.216.34", "2606:4700:4700::1111"])
def test_default_policy_allows_public_addresses(address: str) -> None:
    assert forbidden_address_reason(ipaddress.ip_address(address)) is None


# --- refusals before any connection ----------------------------------------------------------


def test_loopback_url_is_refused_without_the_flag_and_never_contacted() -> None:
    with Server({"/img.png": send(200, PNG)}) as server:
        err = load_error(MediaLoader(MediaConfig()), server.url("/img.png"), "messages[0].x")
        assert server.hits == []
    assert (err.status, err.code, err.param) == (400, FORBIDDEN_CODE, "messages[0].x")
    assert "loopback" in err.message and "--allow-private-urls" in err.message


@pytest.mark.parametrize(
    "host", ["127.1", "2130706433", "0x7f.1", "0.0.0.0", "[::]", "[::1]", "[::ffff:127.0.0.1]"]
)
def test_odd_loopback_spellings_are_refused_without_resolving(host: str) -> None:
    resolver = FakeResolver({})
    requests: list[httpx.Request] = []
    loader = MediaLoader(MediaConfig(), resolver=resolver, transport_factory=no_transport(requests))
    err = load_error(loader, f"http://{host}:8080/img.png")
    assert (err.status, err.code) == (400, FORBIDDEN_CODE)
    assert resolver.calls == [] and requests == []


def test_invalid_ipv4_spelling_is_a_400() -> None:
    err = load_error(MediaLoader(MediaConfig(), resolver=FakeResolver({})), "http://0177.0.0.01/")
    assert err.status == 400 and err.code in ("invalid_image_url", FORBIDDEN_CODE)


@pytest.mark.parametrize(
    "answer", [["10.0.0.7"], ["93.184.216.34", "127.0.0.1"], ["::1"], ["169.254.169.254"]]
)
def test_public_looking_name_resolving_to_a_private_address_is_refused(answer: list[str]) -> None:
    resolver = FakeResolver({"public.test": [answer], "localhost": [["127.0.0.1"]]})
    requests: list[httpx.Request] = []
    loader = MediaLoader(MediaConfig(), resolver=resolver, transport_factory=no_transport(requests))
    err = load_error(loader, "https://public.test/cat.png")
    assert (err.status, err.code) == (400, FORBIDDEN_CODE)
    assert resolver.calls == ["public.test"] and requests == []


def test_unresolvable_name_is_a_400() -> None:
    err = load_error(MediaLoader(MediaConfig(), resolver=FakeResolver({})), "http://nx.test/a.png")
    assert (err.status, err.code) == (400, "image_fetch_failed")
    assert "resolve" in err.message


def test_host_outside_the_allow_list_is_refused_before_resolving() -> None:
    resolver = FakeResolver({"other.test": [["93.184.216.34"]]})
    config = MediaConfig(allowed_url_hosts=("good.test",))
    err = load_error(MediaLoader(config, resolver=resolver), "http://other.test/a.png")
    assert (err.status, err.code) == (400, FORBIDDEN_CODE)
    assert "--allowed-url-host" in err.message and resolver.calls == []


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/a.png",
        "gopher://example.com/",
        "javascript:alert(1)",
        "ws://example.com/",
    ],
)
def test_unsupported_schemes_are_refused_naming_the_supported_forms(url: str) -> None:
    err = load_error(MediaLoader(MediaConfig(), resolver=FakeResolver({})), url)
    assert err.status == 400 and err.code == "unsupported_image_source"
    assert "http" in err.message


# --- pinning and redirects (127.0.0.1 plays public, 127.0.0.2 plays internal) -----------------


def test_connection_goes_to_the_checked_address_with_the_hostname_in_host_header() -> None:
    # The resolver rebinds after the first answer: a second lookup would point at 127.0.0.2.
    resolver = FakeResolver({"public.test": [["127.0.0.1"], ["127.0.0.2"]]})
    loader = MediaLoader(MediaConfig(), resolver=resolver, address_policy=only_127_0_0_2_is_private)
    with Server({"/img.png": send(200, PNG)}) as server:

        async def go() -> str:
            decoded = await loader.load(server.url("/img.png", host="public.test"))
            return decoded.content_hash

        assert asyncio.run(go())
        assert server.hits == [("/img.png", f"public.test:{server.port}")]
    assert resolver.calls == ["public.test"]


def self_signed_cert(tmp_path: Path, name: str) -> tuple[Path, Path]:
    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


def test_tls_uses_the_hostname_for_sni_and_verifies_certificates(tmp_path: Path) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*self_signed_cert(tmp_path, "public.test"))
    server_names: list[str | None] = []
    context.sni_callback = lambda _sock, name, _ctx: server_names.append(name)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(5)

    def accept_one() -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            try:
                context.wrap_socket(conn, server_side=True).close()
            except (ssl.SSLError, OSError):
                pass  # the client rejects our untrusted certificate mid-handshake

    thread = threading.Thread(target=accept_one, daemon=True)
    thread.start()
    resolver = FakeResolver({"public.test": [["127.0.0.1"]]})
    loader = MediaLoader(MediaConfig(), resolver=resolver, address_policy=only_127_0_0_2_is_private)
    port = listener.getsockname()[1]
    err = load_error(loader, f"https://public.test:{port}/img.png")
    thread.join(5)
    listener.close()
    assert server_names == ["public.test"]  # connected to 127.0.0.1, spoke TLS to the name
    assert err.code == "image_fetch_failed" and "CERTIFICATE_VERIFY_FAILED" in err.message


@pytest.mark.parametrize("target", ["name", "literal", "scheme"])
def test_redirect_to_a_forbidden_target_is_refused_when_the_first_hop_is_allowed(
    target: str,
) -> None:
    with Server({"/img.png": send(200, PNG)}, host="127.0.0.2") as internal:
        location = {
            "name": internal.url("/img.png", host="internal.test"),
            "literal": internal.url("/img.png"),
            "scheme": "ftp://internal.test/img.png",
        }[target]
        with Server({"/r": redirect(location)}) as public:
            resolver = FakeResolver(
                {"public.test": [["127.0.0.1"]], "internal.test": [["127.0.0.2"]]}
            )
            loader = MediaLoader(
                MediaConfig(), resolver=resolver, address_policy=only_127_0_0_2_is_private
            )
            err = load_error(loader, public.url("/r", host="public.test"))
            assert [p for p, _ in public.hits] == ["/r"]
        assert internal.hits == []
    assert (err.status, err.code) == (400, FORBIDDEN_CODE)
    assert "redirect" in err.message


def test_allowed_redirects_are_followed_and_every_hop_is_resolved() -> None:
    with Server({}) as server:
        server.routes["/a"] = redirect("/b", 301)
        server.routes["/b"] = redirect(lambda: server.url("/img.png", host="cdn.test"), 307)
        server.routes["/img.png"] = send(200, PNG)
        resolver = FakeResolver({"public.test": [["127.0.0.1"]], "cdn.test": [["127.0.0.1"]]})
        loader = MediaLoader(
            MediaConfig(), resolver=resolver, address_policy=only_127_0_0_2_is_private
        )
        decoded = asyncio.run(loader.load(server.url("/a", host="public.test")))
        assert [p for p, _ in server.hits] == ["/a", "/b", "/img.png"]
    assert decoded.width == 6 and decoded.source == "url"
    assert resolver.calls == ["public.test", "public.test", "cdn.test"]


def test_too_many_redirects_is_a_400_naming_the_flag() -> None:
    with Server({}) as server:
        server.routes["/loop"] = redirect("/loop")
        config = MediaConfig(allow_private_urls=True, max_redirects=2)
        err = load_error(MediaLoader(config), server.url("/loop"))
        assert len(server.hits) == 3  # the first request and two redirects, no more
    assert (err.status, err.code) == (400, "image_fetch_failed")
    assert "--max-redirects" in err.message


# --- limits ----------------------------------------------------------------------------------


def test_byte_cap_is_enforced_while_streaming() -> None:
    def endless(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.end_headers()  # no Content-Length: the body runs until the connection closes
        while not server.stop.is_set():  # only our hang-up (or teardown) ends it
            h.wfile.write(b"\0" * 16384)

    with Server({"/big": endless}) as server:
        config = MediaConfig(allow_private_urls=True, max_image_bytes=50_000)
        start = time.monotonic()
        err = load_error(MediaLoader(config), server.url("/big"))
        elapsed = time.monotonic() - start
    assert (err.status, err.code) == (413, "too_large") and elapsed < 5
    assert "--max-image-bytes" in err.message


def test_content_length_over_the_cap_is_refused_before_reading_the_body() -> None:
    def huge_promise(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(10**9))
        h.end_headers()
        h.wfile.flush()
        server.stop.wait(10)  # never sends the body

    with Server({"/big": huge_promise}) as server:
        config = MediaConfig(allow_private_urls=True, max_image_bytes=1000, read_timeout_s=5)
        start = time.monotonic()
        err = load_error(MediaLoader(config), server.url("/big"))
        elapsed = time.monotonic() - start
    assert (err.status, err.code) == (413, "too_large")
    assert elapsed < 2  # did not wait for the (absent) body


def test_body_shorter_than_a_lying_content_length_fails_cleanly() -> None:
    def short(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", "500")
        h.end_headers()
        h.wfile.write(b"x" * 10)  # then the connection closes

    with Server({"/short": short}) as server:
        err = load_error(MediaLoader(MediaConfig(allow_private_urls=True)), server.url("/short"))
    assert (err.status, err.code) == (400, "image_fetch_failed")


def test_compressed_bodies_are_refused() -> None:
    headers = {"Content-Encoding": "gzip", "Content-Length": "4"}
    with Server({"/gz": send(200, b"abcd", headers)}) as server:
        err = load_error(MediaLoader(MediaConfig(allow_private_urls=True)), server.url("/gz"))
    assert err.status == 400 and "Content-Encoding" in err.message


def test_non_2xx_status_is_a_400_naming_the_status() -> None:
    with Server({}) as server:
        err = load_error(MediaLoader(MediaConfig(allow_private_urls=True)), server.url("/nope"))
    assert (err.status, err.code) == (400, "image_fetch_failed")
    assert "returned HTTP status 404" in err.message


def test_a_url_that_never_answers_fails_within_the_read_timeout() -> None:
    def silent(h: BaseHTTPRequestHandler) -> None:
        server.stop.wait(10)

    with Server({"/slow": silent}) as server:
        config = MediaConfig(allow_private_urls=True, read_timeout_s=0.2)
        start = time.monotonic()
        err = load_error(MediaLoader(config), server.url("/slow"))
        elapsed = time.monotonic() - start
    assert (err.status, err.code) == (400, TIMEOUT_CODE)
    assert "0.2 s" in err.message and elapsed < 2
    assert "--url-read-timeout" in err.message  # what an operator would change


def test_a_slow_drip_body_fails_at_the_overall_deadline() -> None:
    def drip(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.end_headers()
        while not server.stop.wait(0.05):  # each byte well within the read timeout
            h.wfile.write(b"x")
            h.wfile.flush()

    with Server({"/drip": drip}) as server:
        config = MediaConfig(allow_private_urls=True, read_timeout_s=1.0)
        fetcher = UrlFetcher(config, total_timeout_s=0.5)

        async def go() -> APIError:
            with pytest.raises(APIError) as info:
                await fetcher.fetch(server.url("/drip"))
            return info.value

        start = time.monotonic()
        err = asyncio.run(go())
        elapsed = time.monotonic() - start
    assert (err.status, err.code) == (400, TIMEOUT_CODE) and elapsed < 3


# --- deduplication ---------------------------------------------------------------------------


def test_concurrent_fetches_of_the_same_url_hit_the_server_once() -> None:
    def slow_png(h: BaseHTTPRequestHandler) -> None:
        time.sleep(0.3)  # keeps the first fetch in flight while the others arrive
        send(200, PNG)(h)

    with Server({"/img.png": slow_png}) as server:
        loader = MediaLoader(MediaConfig(allow_private_urls=True))

        async def go() -> list[str]:
            results = await asyncio.gather(
                *(loader.load(server.url("/img.png"), f"p{i}") for i in range(5))
            )
            return [r.content_hash for r in results]

        hashes = asyncio.run(go())
        assert len(server.hits) == 1
    assert len(set(hashes)) == 1
    assert loader.stats()["fetch"]["joined"] == 4


def test_a_shared_failure_carries_each_callers_param() -> None:
    def slow_404(h: BaseHTTPRequestHandler) -> None:
        time.sleep(0.2)
        h.send_error(404)

    with Server({"/gone": slow_404}) as server:
        loader = MediaLoader(MediaConfig(allow_private_urls=True))

        async def go() -> list[BaseException]:
            url = server.url("/gone")
            return await asyncio.gather(
                loader.load(url, "a"), loader.load(url, "b"), return_exceptions=True
            )

        errors = asyncio.run(go())
        assert len(server.hits) == 1
    assert [(type(e), getattr(e, "param", None)) for e in errors] == [
        (APIError, "a"),
        (APIError, "b"),
    ]
