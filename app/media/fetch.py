"""Fetching images by URL without becoming a proxy into the operator's network (SSRF).

Every hop, redirects included, is checked: scheme http(s) only; the host is resolved once and every
address it resolves to must be public (not loopback, private, link-local, multicast, reserved or
unspecified, IPv4-mapped and 6to4 IPv6 included) unless the host is allow-listed or private URLs are
allowed. The connection then goes to an address that was checked (the original host travels in
``Host`` and TLS SNI), so a second DNS answer cannot swap in an internal address. HTTPS connections are
not kept alive: the pool is keyed by address, and a connection verified for one name must not carry a
request for another. No cookies are kept between fetches. Bodies are streamed and cut at the byte
limit (after decompression, if the server compresses anyway); the whole fetch has one deadline.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from http.cookiejar import CookieJar, DefaultCookiePolicy

import httpx

from mmencode.app.engine.errors import MediaFetchFailed, PayloadTooLarge, UrlNotAllowed
from mmencode.app.media.kinds import IMAGE, MediaKind

__all__ = ["MediaFetcher", "is_public_address"]

_REDIRECTS = {301, 302, 303, 307, 308}
# A DNS name as httpx encodes it (IDNA, lowercase); anything else is never handed to the resolver.
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?", re.IGNORECASE)
# Answers that are certainly not an image: an HTML error or login page served with 200, an API's JSON.
_NOT_MEDIA_TYPES = ("text", "multipart", "font")
_MEDIA_TYPES = ("image", "audio", "video")  # each refused where another is wanted
_NOT_IMAGE_SUBTYPES = frozenset({"json", "xml", "html", "xhtml+xml", "javascript", "ecmascript", "x-javascript"})


def is_public_address(address: str) -> bool:
    """Whether an IP address (as ``getaddrinfo`` gives it) is on the public internet."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False  # fail closed
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour  # ::ffff:a.b.c.d and 2002:AABB:CCDD::/48 reach a.b.c.d
        if embedded is not None and not is_public_address(str(embedded)):
            return False
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
    if isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local:  # fec0::/10, deprecated but routable
        return False
    return not (
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or not ip.is_global  # e.g. 100.64.0.0/10, shared address space (carrier-grade NAT)
    )


def _is_ip_literal(host: str) -> bool:
    if "%" in host:  # a zone (fe80::1%eth0) names an interface of this machine
        return False
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _normalize_host(host: str) -> str:
    return host.strip().lower().removeprefix("[").removesuffix("]").rstrip(".")


class MediaFetcher:
    def __init__(
        self,
        *,
        timeout: float,
        max_redirects: int,
        max_bytes: int,
        allow_private: bool = False,
        allowed_hosts: Sequence[str] = (),
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.timeout = timeout
        self.max_redirects = max_redirects
        self.max_bytes = max_bytes
        self.allow_private = allow_private
        self.allowed_hosts = {_normalize_host(host) for host in allowed_hosts}
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
            follow_redirects=False,  # each hop is re-checked below
            transport=transport,
            trust_env=False,  # an HTTP(S)_PROXY in the environment must not route around the checks
            # One user's fetch must not receive cookies another site set for another user's fetch.
            cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),
            # Bodies are counted as they arrive; a compressed body is decoded here, within the limit.
            headers={"User-Agent": "mmencode", "Accept-Encoding": "identity", "Accept": "image/*, */*;q=0.5"},
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def fetch(self, url: str, *, kind: MediaKind = IMAGE, max_bytes: int | None = None) -> bytes:
        """The body at ``url``, meant to be ``kind`` (images: up to the fetcher's ``max_bytes``)."""
        want = _Want(kind, self.max_bytes if max_bytes is None else max_bytes)
        try:
            async with asyncio.timeout(self.timeout):
                return await self._fetch(url, want)
        except TimeoutError:
            raise MediaFetchFailed(
                f"fetching {url} took longer than the timeout of {self.timeout}s",
                details={"url": url, "reason": "timeout", "timeout": self.timeout},
            ) from None

    async def _fetch(self, url: str, want: _Want) -> bytes:
        current = url
        for _ in range(self.max_redirects + 1):
            target = self._parse(current)
            addresses = await self._checked_addresses(target)
            response = await self._send(target, addresses, current)
            try:
                if response.status_code in _REDIRECTS and "location" in response.headers:
                    current = self._redirect_target(target, response.headers["location"], current)
                    continue
                if not response.is_success:
                    raise MediaFetchFailed(
                        f"{current} answered HTTP {response.status_code}",
                        details={"url": current, "reason": "http_status", "status": response.status_code},
                    )
                self._check_content_type(response, current, want.kind)
                return await self._read_capped(response, current, want)
            except httpx.HTTPError as exc:
                raise MediaFetchFailed(
                    f"reading {current} failed: {_describe(exc)}",
                    details={"url": current, "reason": type(exc).__name__},
                ) from None
            finally:
                await response.aclose()
        raise MediaFetchFailed(
            f"{url} redirected more than {self.max_redirects} times (too many redirects)",
            details={"url": url, "reason": "too_many_redirects", "max_redirects": self.max_redirects},
        )

    async def _send(self, target: httpx.URL, addresses: Sequence[str], url: str) -> httpx.Response:
        """Send the GET to the checked addresses in turn until one connects."""
        host = target.raw_host.decode("ascii")
        headers = {"Host": target.netloc.decode("ascii")}  # netloc: the port only where it is not the default
        extensions = None
        if target.scheme == "https":
            headers["Connection"] = "close"
            extensions = {"sni_hostname": host}
        failure: Exception | None = None
        for address in addresses:
            try:
                request = self._client.build_request(
                    "GET", target.copy_with(host=address), headers=headers, extensions=extensions
                )
                return await self._client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                failure = exc  # on to the next address, if any
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                failure = exc
                break
        assert failure is not None
        raise MediaFetchFailed(
            f"fetching {url} failed: {_describe(failure)}",
            details={"url": url, "reason": type(failure).__name__},
        )

    def _parse(self, url: str) -> httpx.URL:
        try:
            target = httpx.URL(url)
        except (httpx.InvalidURL, TypeError, ValueError) as exc:
            raise UrlNotAllowed(f"not a valid URL: {exc}", details={"url": url}) from None
        if target.scheme not in ("http", "https"):
            raise UrlNotAllowed(
                f"scheme {target.scheme!r} is not allowed; use http or https",
                details={"url": url, "scheme": target.scheme},
            )
        if not target.host:
            raise UrlNotAllowed("URL has no host", details={"url": url})
        host = target.raw_host.decode("ascii")
        if not (_is_ip_literal(host) if ":" in host else _HOSTNAME.fullmatch(host)):
            raise UrlNotAllowed(f"{target.host!r} is not a valid host name", details={"url": url, "host": target.host})
        if target.port is not None and not 0 < target.port < 65536:
            raise UrlNotAllowed(f"port {target.port} is not a valid port", details={"url": url, "port": target.port})
        return target

    def _redirect_target(self, target: httpx.URL, location: str, current: str) -> str:
        try:
            return str(target.join(location))
        except (httpx.InvalidURL, TypeError, ValueError) as exc:
            raise MediaFetchFailed(
                f"{current} redirected to an invalid URL {location!r}: {exc}",
                details={"url": current, "reason": "invalid_redirect", "location": location},
            ) from None

    async def _checked_addresses(self, target: httpx.URL) -> list[str]:
        """The addresses ``target``'s host resolves to, once; all must be allowed, else nothing is sent."""
        host = target.raw_host.decode("ascii")  # IDNA-encoded as httpx would; IPv6 without brackets
        port = target.port or (443 if target.scheme == "https" else 80)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise MediaFetchFailed(
                f"cannot resolve {target.host!r}: {exc}", details={"host": target.host, "reason": "dns"}
            ) from None
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        if not addresses:
            raise MediaFetchFailed(
                f"{target.host!r} resolves to no address", details={"host": target.host, "reason": "dns"}
            )
        names = {_normalize_host(host), _normalize_host(target.host)}  # IDNA and Unicode spellings
        exempt = self.allow_private or not names.isdisjoint(self.allowed_hosts)
        if not exempt:
            blocked = [address for address in addresses if not is_public_address(address)]
            if blocked:
                raise UrlNotAllowed(
                    f"{target.host!r} resolves to a non-public address ({blocked[0]}); to fetch from it, "
                    f"start mmencode with --allowed-url-hosts {target.host} (this host only) or "
                    "--allow-private-urls (every private address), or send the image itself",
                    details={"host": target.host, "addresses": blocked},
                )
        return addresses

    @staticmethod
    def _check_content_type(response: httpx.Response, url: str, wanted: MediaKind) -> None:
        content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
        kind, _, subtype = content_type.partition("/")
        if kind == wanted.name or not content_type:
            return
        refused = {*_NOT_MEDIA_TYPES, *_MEDIA_TYPES} - {wanted.name}
        if kind in refused or subtype in _NOT_IMAGE_SUBTYPES or subtype.endswith(("+json", "+xml")):
            raise MediaFetchFailed(
                f"{url} returned {content_type!r}, not {'an' if wanted.name[0] in 'aeiou' else 'a'} {wanted.name}",
                details={"url": url, "reason": "content_type", "content_type": content_type},
            )

    @staticmethod
    def _too_large(url: str, declared: str, want: _Want) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"{url} is {declared} bytes (Content-Length), over the limit of {want.max_bytes} ({want.kind.flag})",
            details={"limit": want.kind.limit, "max_bytes": want.max_bytes, "url": url},
        )

    async def _read_capped(self, response: httpx.Response, url: str, want: _Want) -> bytes:
        encoding = response.headers.get("content-encoding", "identity").strip().lower()
        inflater = None
        if encoding in ("", "identity"):
            declared = response.headers.get("content-length", "").strip()
            if declared.isdigit() and int(declared) > want.max_bytes:
                raise self._too_large(url, declared, want)
        elif encoding in ("gzip", "x-gzip", "deflate"):
            # Asked for identity, got compression anyway: inflate here, never past the limit (bombs).
            inflater = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib header, detected
        else:
            raise MediaFetchFailed(
                f"{url} used content-encoding {encoding!r}, which is not supported",
                details={"url": url, "reason": "content_encoding", "content_encoding": encoding},
            )
        body = bytearray()
        async for chunk in response.aiter_raw():
            if inflater is None:
                self._append(body, chunk, url, want)
                continue
            data = chunk
            while data and not inflater.eof:
                try:
                    piece = inflater.decompress(data, want.max_bytes - len(body) + 1)
                except zlib.error as exc:
                    raise MediaFetchFailed(
                        f"{url} sent a corrupt compressed body: {exc}",
                        details={"url": url, "reason": "content_encoding"},
                    ) from None
                self._append(body, piece, url, want)
                data = inflater.unconsumed_tail
        if inflater is not None:
            self._append(body, inflater.flush(), url, want)  # what zlib still holds: at most one match
        return bytes(body)

    @staticmethod
    def _append(body: bytearray, chunk: bytes, url: str, want: _Want) -> None:
        if len(body) + len(chunk) > want.max_bytes:
            raise PayloadTooLarge(
                f"{url} is more than {want.max_bytes} bytes, over the limit ({want.kind.flag})",
                details={"limit": want.kind.limit, "max_bytes": want.max_bytes, "url": url},
            )
        body += chunk


@dataclass(frozen=True, slots=True)
class _Want:
    """What one fetch expects: the kind of file, and how many bytes it may have."""

    kind: MediaKind
    max_bytes: int


def _describe(exc: BaseException) -> str:
    text = str(exc)
    described = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return f"timed out ({described})" if isinstance(exc, httpx.TimeoutException) else described
