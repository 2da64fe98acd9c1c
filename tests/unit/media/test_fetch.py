"""``MediaFetcher`` and ``is_public_address``: the SSRF checks, limits and failures of URL fetching.

Real traffic goes only to :class:`ImageServer`, an in-process HTTP server on loopback (127.0.0.1, and
::1 where it exists), reached through the test-only allowlist. Anything that must be refused is refused
before a connection is attempted; requests to other hosts use ``httpx.MockTransport`` with a faked
resolver, so nothing leaves the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import threading
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from mmencode.app.engine.errors import MediaFetchFailed, PayloadTooLarge, UrlNotAllowed
from mmencode.app.media.fetch import MediaFetcher, is_public_address
from tests.helpers import free_port, image_bytes, noise_image

PNG = image_bytes(noise_image(48, 40, seed=21))
HUGE = 256 * 1024 * 1024  # what the oversized routes would send if nobody hung up
CHUNK = 64 * 1024
GZIP_BOMB = gzip.compress(bytes(16 * 1024 * 1024), compresslevel=1)  # 16 MiB of zeros in ~70 KiB


# ---------------------------------------------------------------------------------------------------
# The loopback image server (also used by tests/e2e/test_fetch_http.py)
# ---------------------------------------------------------------------------------------------------
@dataclass
class Served:
    """What one oversized route did: bytes written before the client hung up, and whether it finished."""

    sent: int = 0
    completed: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class ImageServer:
    """Routes: /good.png, /slow, /loop, /chain/N, /redirect?to=URL, /big-length, /big-stream, /missing,
    /html, /gzip.png, /gzip-bomb, /brotli, /truncated, /cookie, /echo (records the request headers)."""

    def __init__(self, host: str = "127.0.0.1", slow_seconds: float = 5.0) -> None:
        self.slow_seconds = slow_seconds
        self.release = threading.Event()  # set at shutdown: the slow route stops waiting
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.streams: dict[str, Served] = {}
        server_class = _Server6 if ":" in host else _Server4
        self.httpd = server_class((host, 0), _handler(self))
        self.port = int(self.httpd.server_address[1])
        bracketed = f"[{host}]" if ":" in host else host
        self.url = f"http://{bracketed}:{self.port}"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, name=f"images-{self.port}", daemon=True
        )

    def start(self) -> ImageServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)

    def served(self, route: str) -> Served:
        return self.streams.setdefault(route, Served())

    def headers_of(self, path: str) -> dict[str, str]:
        matching = [headers for seen, headers in self.requests if seen == path]
        assert matching, f"{path} was never requested; saw {[seen for seen, _ in self.requests]}"
        return matching[-1]

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]


class _Server4(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Server6(_Server4):
    address_family = socket.AF_INET6


def _handler(state: ImageServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            state.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
            route = parts.path
            if route in ("/good.png", "/echo"):
                self._send(200, PNG, "image/png")
            elif route == "/cookie":
                self._send(200, PNG, "image/png", {"Set-Cookie": "session=secret; Path=/"})
            elif route == "/slow":
                state.release.wait(state.slow_seconds)
                self._send(200, PNG, "image/png")
            elif route == "/loop":
                self._send(302, b"", "text/plain", {"Location": "/loop"})
            elif route.startswith("/chain/"):
                left = int(route.removeprefix("/chain/"))
                location = f"/chain/{left - 1}" if left > 1 else "/good.png"
                self._send(302, b"", "text/plain", {"Location": location})
            elif route == "/redirect":
                location = parse_qs(parts.query)["to"][0]
                self._send(302, b"", "text/plain", {"Location": location})
            elif route == "/big-length":
                self._stream(route, declared=True)
            elif route == "/big-stream":
                self._stream(route, declared=False)
            elif route == "/missing":
                self._send(404, b"not here", "text/plain")
            elif route == "/html":
                self._send(200, b"<html><body>log in first</body></html>", "text/html; charset=utf-8")
            elif route == "/gzip.png":
                self._send(200, gzip.compress(PNG), "image/png", {"Content-Encoding": "gzip"})
            elif route == "/gzip-bomb":
                self._send(200, GZIP_BOMB, "image/png", {"Content-Encoding": "gzip"})
            elif route == "/brotli":
                self._send(200, PNG, "image/png", {"Content-Encoding": "br"})
            elif route == "/truncated":
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(PNG)))
                self.end_headers()
                self.wfile.write(PNG[:100])
                self.wfile.flush()
                self.close_connection = True
            else:
                self._send(404, b"no such route", "text/plain")

        def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def _stream(self, route: str, *, declared: bool) -> None:
            served = state.served(route)
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            if declared:
                self.send_header("Content-Length", str(HUGE))
            else:
                self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            block = PNG[:CHUNK].ljust(CHUNK, b"\0")
            framed = block if declared else f"{len(block):x}\r\n".encode() + block + b"\r\n"
            try:
                while served.sent < HUGE:
                    self.wfile.write(framed)
                    served.sent += len(block)
                if not declared:
                    self.wfile.write(b"0\r\n\r\n")
                served.completed = True
            except OSError:  # the client hung up: what the fetcher should do
                pass
            finally:
                self.close_connection = True
                served.done.set()

    return Handler


@contextlib.contextmanager
def image_server(host: str = "127.0.0.1", slow_seconds: float = 5.0) -> Iterator[ImageServer]:
    server = ImageServer(host, slow_seconds).start()
    try:
        yield server
    finally:
        server.stop()


def ipv6_loopback_available() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------------------------------
TIMEOUT = 1.0
MAX_BYTES = 256 * 1024


@pytest.fixture(scope="module")
def server() -> Iterator[ImageServer]:
    with image_server() as running:
        yield running


@pytest.fixture
async def fetcher() -> AsyncIterator[MediaFetcher]:
    fetcher = MediaFetcher(timeout=TIMEOUT, max_redirects=3, max_bytes=MAX_BYTES, allowed_hosts=["127.0.0.1"])
    yield fetcher
    await fetcher.aclose()


@pytest.fixture(autouse=True)
async def fake_dns(monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, list[str]]], list[str]]:
    """No test here may query a real DNS server: ``getaddrinfo`` on the loop answers numeric hosts and
    ``localhost`` as the system does, names in the installed table from it, and fails for the rest.
    Calling the fixture installs a table; it returns the list of names the fetcher asked for."""
    loop = asyncio.get_running_loop()
    real = loop.getaddrinfo
    table: dict[str, list[str]] = {}
    asked: list[str] = []

    async def getaddrinfo(host: str, port: int, **kwargs: Any) -> list[Any]:
        asked.append(host)
        if host in table:
            return [
                (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
                for a in table[host]
            ]
        if host == "localhost":
            return await real(host, port, **kwargs)
        return await real(host, port, **{**kwargs, "flags": socket.AI_NUMERICHOST})

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)

    def install(entries: dict[str, list[str]]) -> list[str]:
        table.update(entries)
        return asked

    return install


def mock_fetcher(handler: Callable[[httpx.Request], httpx.Response], **kwargs: Any) -> MediaFetcher:
    options: dict[str, Any] = {"timeout": TIMEOUT, "max_redirects": 3, "max_bytes": MAX_BYTES}
    options.update(kwargs)
    return MediaFetcher(transport=httpx.MockTransport(handler), **options)


def streamed(status: int, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    """A mock response that streams like a real one (``content=`` would be read in advance)."""
    return httpx.Response(
        status, stream=httpx.ByteStream(body), headers={"Content-Length": str(len(body)), **(headers or {})}
    )


def png_response(request: httpx.Request) -> httpx.Response:
    return streamed(200, PNG, {"Content-Type": "image/png"})


# ---------------------------------------------------------------------------------------------------
# is_public_address
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("127.0.0.1", False),
        ("127.1.2.3", False),
        ("10.0.0.1", False),
        ("10.255.255.255", False),
        ("172.16.0.1", False),
        ("172.31.255.254", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # cloud metadata
        ("0.0.0.0", False),
        ("224.0.0.1", False),  # multicast
        ("240.0.0.1", False),  # reserved
        ("255.255.255.255", False),
        ("100.64.0.1", False),  # shared address space (carrier-grade NAT)
        ("192.0.0.1", False),
        ("198.18.0.1", False),  # benchmarking
        ("::1", False),
        ("::", False),
        ("fe80::1", False),
        ("fe80::1%1", False),
        ("fc00::1", False),
        ("fd12:3456::1", False),
        ("fec0::1", False),  # site-local
        ("ff02::1", False),  # multicast
        ("2001:db8::1", False),  # documentation
        ("::ffff:127.0.0.1", False),  # IPv4-mapped
        ("::ffff:10.0.0.1", False),
        ("::ffff:169.254.169.254", False),
        ("::127.0.0.1", False),  # IPv4-compatible (deprecated)
        ("64:ff9b::a00:1", False),  # NAT64 of 10.0.0.1
        ("2002:7f00:1::", False),  # 6to4 of 127.0.0.1
        ("2002:a00:1::1", False),  # 6to4 of 10.0.0.1
        ("not an address", False),
        ("8.8.8.8", True),
        ("1.1.1.1", True),
        ("2001:4860:4860::8888", True),
        ("::ffff:8.8.8.8", True),
        ("2002:808:808::1", True),  # 6to4 of 8.8.8.8
    ],
)
def test_is_public_address(address: str, public: bool) -> None:
    assert is_public_address(address) is public


# ---------------------------------------------------------------------------------------------------
# Refusals before any connection
# ---------------------------------------------------------------------------------------------------
def _refusing(request: httpx.Request) -> httpx.Response:
    raise AssertionError(f"nothing may be sent, but {request.url} was")


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "ftp://127.0.0.1/image.png",
        "gopher://127.0.0.1:70/_GET",
        "data:image/png;base64,AAAA",
        "javascript:alert(1)",
        "//example.com/a.png",
        "http:///no-host",
        "http://exa mple.com/",
        "http://example.com:99999/",
        "http://example.com:0/",
        "http://-x.example/",
        "http://a..b/",
        "http://[fe80::1%25eth0]/",
    ],
)
async def test_only_http_and_https_urls(url: str) -> None:
    fetcher = mock_fetcher(_refusing, allow_private=True)
    with pytest.raises(UrlNotAllowed) as caught:
        await fetcher.fetch(url)
    if url.startswith(("file:", "ftp:", "gopher:")):
        assert "scheme" in caught.value.message
    await fetcher.aclose()


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://localhost/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://10.0.0.1/",
        "https://169.254.169.254/latest/meta-data/",
        "http://0.0.0.0:8000/",
        "http://[fe80::1]/",
        "http://100.64.0.1/",
        "http://2130706433/",  # 127.0.0.1 as one decimal number
        "http://0x7f.1/",
    ],
)
async def test_private_destinations_are_refused_before_connecting(url: str) -> None:
    fetcher = mock_fetcher(_refusing)
    started = time.monotonic()
    with pytest.raises(UrlNotAllowed):
        await fetcher.fetch(url)
    assert time.monotonic() - started < 0.5
    await fetcher.aclose()


async def test_hostname_resolving_to_private_address_is_refused(fake_dns: Callable[..., list[str]]) -> None:
    asked = fake_dns({"intranet.example": ["10.1.2.3"], "mixed.example": ["93.184.216.34", "192.168.0.7"]})
    fetcher = mock_fetcher(_refusing)
    with pytest.raises(UrlNotAllowed) as private:
        await fetcher.fetch("http://intranet.example/cat.png")
    assert private.value.details == {"host": "intranet.example", "addresses": ["10.1.2.3"]}
    # One private answer among public ones is enough: a rebinding attacker controls the order.
    with pytest.raises(UrlNotAllowed) as mixed:
        await fetcher.fetch("https://mixed.example/cat.png")
    assert mixed.value.details is not None and mixed.value.details["addresses"] == ["192.168.0.7"]
    assert asked == ["intranet.example", "mixed.example"]
    await fetcher.aclose()


async def test_localhost_is_refused_unless_listed(server: ImageServer, fetcher: MediaFetcher) -> None:
    with pytest.raises(UrlNotAllowed):
        await fetcher.fetch(f"http://localhost:{server.port}/good.png")
    # The allowlist names hosts: allowing 127.0.0.1 does not allow other names for it.
    listed = MediaFetcher(timeout=TIMEOUT, max_redirects=0, max_bytes=MAX_BYTES, allowed_hosts=["LOCALHOST"])
    try:
        assert await listed.fetch(f"http://localhost:{server.port}/good.png") == PNG
    finally:
        await listed.aclose()


async def test_allow_private_urls(server: ImageServer) -> None:
    fetcher = MediaFetcher(timeout=TIMEOUT, max_redirects=0, max_bytes=MAX_BYTES, allow_private=True)
    try:
        assert await fetcher.fetch(f"{server.url}/good.png") == PNG
    finally:
        await fetcher.aclose()


async def test_resolution_failure_is_a_fetch_failure() -> None:
    # Not numeric, not in the table: the fake resolver fails like a missing name.
    fetcher = mock_fetcher(_refusing)
    with pytest.raises(MediaFetchFailed, match="cannot resolve"):
        await fetcher.fetch("http://no-such-host.invalid/a.png")
    await fetcher.aclose()


@pytest.mark.parametrize(
    "location",
    [
        "http://10.0.0.1/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:8080/",
        "http://[::ffff:127.0.0.1]/",
        "http://localhost/",
        "http://0.0.0.0:8000/",
        "http://intranet.example/",
        "file:///etc/passwd",
    ],
)
async def test_every_redirect_hop_is_checked(location: str, fake_dns: Callable[..., list[str]]) -> None:
    fake_dns({"cdn.example": ["93.184.216.34"], "intranet.example": ["10.9.9.9"], "localhost": ["127.0.0.1"]})
    sent: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(str(request.url))
        return httpx.Response(302, headers={"Location": location})

    fetcher = mock_fetcher(handler)
    with pytest.raises(UrlNotAllowed) as caught:
        await fetcher.fetch("https://cdn.example/a.png")
    assert sent == ["https://93.184.216.34/a.png"]
    assert ("scheme" if location.startswith("file:") else "non-public") in caught.value.message
    await fetcher.aclose()


# ---------------------------------------------------------------------------------------------------
# Where the request goes, and what it says: the checked address, the original Host and SNI
# ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "resolved", "sent_url", "host_header"),
    [
        ("https://images.example/a.png?x=1", "93.184.216.34", "https://93.184.216.34/a.png?x=1", "images.example"),
        ("https://images.example:443/a.png", "93.184.216.34", "https://93.184.216.34/a.png", "images.example"),
        ("http://images.example:80/a.png", "93.184.216.34", "http://93.184.216.34/a.png", "images.example"),
        ("http://IMAGES.example:8080/a.png", "93.184.216.34", "http://93.184.216.34:8080/a.png", "images.example:8080"),
        ("https://images.example:8443/a", "2606:4700::1", "https://[2606:4700::1]:8443/a", "images.example:8443"),
        ("http://bücher.example/a.png", "93.184.216.34", "http://93.184.216.34/a.png", "xn--bcher-kva.example"),
        (
            "http://[2606:4700::1111]:8080/a",
            "2606:4700::1111",
            "http://[2606:4700::1111]:8080/a",
            "[2606:4700::1111]:8080",
        ),
        ("http://[2606:4700::1111]/a", "2606:4700::1111", "http://[2606:4700::1111]/a", "[2606:4700::1111]"),
        ("https://8.8.8.8/a", "8.8.8.8", "https://8.8.8.8/a", "8.8.8.8"),
    ],
)
async def test_connects_to_checked_address_with_original_host(
    url: str, resolved: str, sent_url: str, host_header: str, fake_dns: Callable[..., list[str]]
) -> None:
    asked = fake_dns({"images.example": [resolved], "xn--bcher-kva.example": [resolved]})
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return png_response(request)

    fetcher = mock_fetcher(handler)
    assert await fetcher.fetch(url) == PNG
    await fetcher.aclose()
    (request,) = seen
    assert str(request.url) == sent_url
    assert request.headers["host"] == host_header
    assert request.headers["accept-encoding"] == "identity"
    hostname = httpx.URL(url).raw_host.decode()
    if url.startswith("https"):
        assert request.extensions["sni_hostname"] == hostname  # TLS is verified for the name, not the IP
        assert request.headers["connection"] == "close"  # no pooled TLS connection across names
    else:
        assert "sni_hostname" not in request.extensions
    assert asked == [hostname]  # resolved once, by its IDNA name


async def test_sni_is_the_hostname(fake_dns: Callable[..., list[str]]) -> None:
    fake_dns({"images.example": ["93.184.216.34"]})
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return png_response(request)

    fetcher = mock_fetcher(handler)
    await fetcher.fetch("https://images.example:8443/a.png")
    await fetcher.aclose()
    assert seen[0].extensions["sni_hostname"] == "images.example"
    assert seen[0].url.host == "93.184.216.34"


async def test_host_header_over_a_real_connection(server: ImageServer, fetcher: MediaFetcher) -> None:
    assert await fetcher.fetch(f"{server.url}/echo?n=1") == PNG
    headers = server.headers_of("/echo?n=1")
    assert headers["host"] == f"127.0.0.1:{server.port}"
    assert headers["user-agent"] == "mmencode"


async def test_falls_back_to_the_next_checked_address(server: ImageServer, fake_dns: Callable[..., list[str]]) -> None:
    # ::1 has no listener on this port (the server is on 127.0.0.1 only): the next address serves.
    fake_dns({"dual.test": ["::1", "127.0.0.1"]})
    fetcher = MediaFetcher(timeout=TIMEOUT, max_redirects=0, max_bytes=MAX_BYTES, allowed_hosts=["dual.test"])
    try:
        assert await fetcher.fetch(f"http://dual.test:{server.port}/echo?n=dual") == PNG
    finally:
        await fetcher.aclose()
    assert server.headers_of("/echo?n=dual")["host"] == f"dual.test:{server.port}"


@pytest.mark.skipif(not ipv6_loopback_available(), reason="no IPv6 loopback here")
async def test_ipv6_literal_over_a_real_connection() -> None:
    with image_server("::1") as server6:
        fetcher = MediaFetcher(timeout=TIMEOUT, max_redirects=3, max_bytes=MAX_BYTES, allowed_hosts=["[::1]"])
        try:
            assert await fetcher.fetch(f"{server6.url}/chain/2") == PNG
        finally:
            await fetcher.aclose()
        assert server6.paths() == ["/chain/2", "/chain/1", "/good.png"]
        assert server6.headers_of("/good.png")["host"] == f"[::1]:{server6.port}"


async def test_no_cookies_are_kept_between_fetches(server: ImageServer, fetcher: MediaFetcher) -> None:
    await fetcher.fetch(f"{server.url}/cookie")
    await fetcher.fetch(f"{server.url}/echo?n=cookie")
    assert "cookie" not in server.headers_of("/echo?n=cookie")


# ---------------------------------------------------------------------------------------------------
# Against the loopback server: success, redirects, timeouts, sizes, statuses, content types
# ---------------------------------------------------------------------------------------------------
async def test_good_png(server: ImageServer, fetcher: MediaFetcher) -> None:
    assert await fetcher.fetch(f"{server.url}/good.png") == PNG


async def test_redirect_chain_within_the_limit(server: ImageServer, fetcher: MediaFetcher) -> None:
    assert await fetcher.fetch(f"{server.url}/chain/3") == PNG  # 3 redirects, limit 3


async def test_redirect_chain_over_the_limit(server: ImageServer, fetcher: MediaFetcher) -> None:
    with pytest.raises(MediaFetchFailed, match="redirect") as caught:
        await fetcher.fetch(f"{server.url}/chain/4")
    assert caught.value.details is not None and caught.value.details["max_redirects"] == 3


async def test_redirect_loop(server: ImageServer, fetcher: MediaFetcher) -> None:
    started = time.monotonic()
    with pytest.raises(MediaFetchFailed, match="redirect"):
        await fetcher.fetch(f"{server.url}/loop")
    assert time.monotonic() - started < TIMEOUT


async def test_zero_redirects_allowed(server: ImageServer) -> None:
    fetcher = MediaFetcher(timeout=TIMEOUT, max_redirects=0, max_bytes=MAX_BYTES, allowed_hosts=["127.0.0.1"])
    try:
        assert await fetcher.fetch(f"{server.url}/good.png") == PNG
        with pytest.raises(MediaFetchFailed, match="redirect"):
            await fetcher.fetch(f"{server.url}/chain/1")
    finally:
        await fetcher.aclose()


async def test_redirect_to_localhost_name_is_refused(server: ImageServer, fetcher: MediaFetcher) -> None:
    target = f"http://localhost:{server.port}/echo?n=via-localhost"
    with pytest.raises(UrlNotAllowed):
        await fetcher.fetch(f"{server.url}/redirect?to={target}")
    assert "/echo?n=via-localhost" not in server.paths()


async def test_redirect_to_invalid_location(server: ImageServer, fetcher: MediaFetcher) -> None:
    # httpx reads "http://[bad" as the host "%5bbad": refused like a bad host in the request, unresolved.
    with pytest.raises((MediaFetchFailed, UrlNotAllowed), match=r"not a valid|invalid URL"):
        await fetcher.fetch(f"{server.url}/redirect?to=http://[bad")


@pytest.mark.parametrize("location", ["http://h:abc/", "http://h:99999/"])
async def test_redirect_to_unparseable_location(location: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return streamed(302, b"", {"Location": location})

    fetcher = mock_fetcher(handler, allow_private=True)
    with pytest.raises((MediaFetchFailed, UrlNotAllowed), match=r"(?i)invalid URL|not a valid"):
        await fetcher.fetch("http://127.0.0.1/a.png")
    await fetcher.aclose()


async def test_slow_server_times_out(server: ImageServer, fetcher: MediaFetcher) -> None:
    started = time.monotonic()
    with pytest.raises(MediaFetchFailed) as caught:
        await fetcher.fetch(f"{server.url}/slow")
    elapsed = time.monotonic() - started
    assert TIMEOUT * 0.9 <= elapsed < TIMEOUT + 1.0
    assert "time" in caught.value.message.lower()


async def test_slow_body_hits_the_total_deadline() -> None:
    """A server that trickles bytes (each read within the read timeout) still stops at the deadline."""

    async def trickle() -> AsyncIterator[bytes]:
        for _ in range(100):
            await asyncio.sleep(0.05)
            yield b"x"

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=trickle(), headers={"Content-Type": "image/png"})

    fetcher = mock_fetcher(handler, timeout=0.5, allow_private=True)
    started = time.monotonic()
    with pytest.raises(MediaFetchFailed, match="took longer"):
        await fetcher.fetch("http://127.0.0.1/a.png")
    assert time.monotonic() - started < 1.5
    await fetcher.aclose()


@pytest.mark.parametrize("route", ["/big-length", "/big-stream"])
async def test_oversized_body_is_cut_without_reading_it(route: str, fetcher: MediaFetcher) -> None:
    with image_server() as own:  # its own server: the streams are counted per route
        started = time.monotonic()
        with pytest.raises(PayloadTooLarge) as caught:
            await fetcher.fetch(f"{own.url}{route}")
        assert time.monotonic() - started < TIMEOUT
        assert caught.value.details is not None and caught.value.details["max_bytes"] == MAX_BYTES
        served = own.served(route)
        assert served.done.wait(5), "the server kept sending after the fetcher gave up"
        assert not served.completed
        assert served.sent < HUGE // 8, served.sent


async def test_declared_length_is_refused_before_the_body() -> None:
    seen: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        async def body() -> AsyncIterator[bytes]:
            seen.append(1)
            yield b"x" * 10

        return httpx.Response(200, content=body(), headers={"Content-Length": str(MAX_BYTES + 1)})

    fetcher = mock_fetcher(handler, allow_private=True)
    with pytest.raises(PayloadTooLarge, match="Content-Length"):
        await fetcher.fetch("http://127.0.0.1/a.png")
    assert seen == []
    await fetcher.aclose()


async def test_exactly_the_limit_is_accepted() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return streamed(200, b"y" * MAX_BYTES)

    fetcher = mock_fetcher(handler, allow_private=True)
    assert len(await fetcher.fetch("http://127.0.0.1/a.png")) == MAX_BYTES
    await fetcher.aclose()


async def test_gzip_body_is_inflated(server: ImageServer, fetcher: MediaFetcher) -> None:
    assert await fetcher.fetch(f"{server.url}/gzip.png") == PNG


async def test_gzip_bomb_is_cut_at_the_limit(server: ImageServer, fetcher: MediaFetcher) -> None:
    with pytest.raises(PayloadTooLarge):
        await fetcher.fetch(f"{server.url}/gzip-bomb")


async def test_compressed_body_is_inflated_within_the_limit() -> None:
    """A gzip bomb in one chunk: never more than about the limit is held, not the 16 MiB it inflates to."""

    def handler(request: httpx.Request) -> httpx.Response:
        return streamed(200, GZIP_BOMB, {"Content-Type": "image/png", "Content-Encoding": "gzip"})

    fetcher = mock_fetcher(handler, allow_private=True)  # the compressed body fits: 70 KiB < 256 KiB
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLarge):
            await fetcher.fetch("http://127.0.0.1/bomb.png")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await fetcher.aclose()
    assert peak < 2 * 1024 * 1024, peak


async def test_unsupported_content_encoding(server: ImageServer, fetcher: MediaFetcher) -> None:
    with pytest.raises(MediaFetchFailed, match="content-encoding"):
        await fetcher.fetch(f"{server.url}/brotli")


async def test_truncated_body(server: ImageServer, fetcher: MediaFetcher) -> None:
    with pytest.raises(MediaFetchFailed, match=r"RemoteProtocolError|ReadError"):
        await fetcher.fetch(f"{server.url}/truncated")


async def test_http_error_status(server: ImageServer, fetcher: MediaFetcher) -> None:
    with pytest.raises(MediaFetchFailed, match="404") as caught:
        await fetcher.fetch(f"{server.url}/missing")
    assert caught.value.details is not None and caught.value.details["status"] == 404


async def test_html_is_not_an_image(server: ImageServer, fetcher: MediaFetcher) -> None:
    with pytest.raises(MediaFetchFailed, match="text/html"):
        await fetcher.fetch(f"{server.url}/html")


@pytest.mark.parametrize(
    ("content_type", "accepted"),
    [
        ("image/png", True),
        ("image/jpeg; charset=binary", True),
        ("application/octet-stream", True),
        ("binary/octet-stream", True),
        ("", True),
        ("text/html", False),
        ("text/plain; charset=utf-8", False),
        ("application/json", False),
        ("application/problem+json", False),
        ("application/xhtml+xml", False),
        ("application/xml", False),
        ("video/mp4", False),
    ],
)
async def test_content_type_sanity(content_type: str, accepted: bool) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"Content-Type": content_type} if content_type else {}
        return streamed(200, PNG, headers)

    fetcher = mock_fetcher(handler, allow_private=True)
    if accepted:
        assert await fetcher.fetch("http://127.0.0.1/a") == PNG
    else:
        with pytest.raises(MediaFetchFailed, match="not an image"):
            await fetcher.fetch("http://127.0.0.1/a")
    await fetcher.aclose()


async def test_connection_refused(fetcher: MediaFetcher) -> None:
    port = free_port()  # free a moment ago: nothing listens on it
    with pytest.raises(MediaFetchFailed, match="ConnectError"):
        await fetcher.fetch(f"http://127.0.0.1:{port}/a.png")
