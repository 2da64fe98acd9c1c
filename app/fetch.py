"""Fetching images by URL without becoming a proxy into the operator's network (SSRF).

Every hop, redirects included, is checked: scheme http(s) only; the host is resolved once and every
address it resolves to must be public (not loopback, private, link-local, multicast, reserved or
unspecified, IPv4-mapped IPv6 included) unless the host is allow-listed or private URLs are allowed.
The connection then goes to the address that was checked (the original host travels in ``Host`` and
TLS SNI), so a second DNS answer cannot swap in an internal address. Bodies are streamed and cut at
the byte limit; the whole fetch has one deadline.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence

import httpx

from app.errors import ImageFetchFailed, PayloadTooLarge, UrlNotAllowed

__all__ = ["ImageFetcher", "is_public_address"]

_REDIRECTS = {301, 302, 303, 307, 308}


def is_public_address(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not (
        ip.is_loopback
        or ip.is_private
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or not ip.is_global
    )


class ImageFetcher:
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
        self.allowed_hosts = {host.lower() for host in allowed_hosts}
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
            follow_redirects=False,  # each hop is re-checked below
            transport=transport,
            trust_env=False,  # an HTTP(S)_PROXY in the environment must not route around the checks
            headers={"User-Agent": "mmencode"},
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def fetch(self, url: str) -> bytes:
        try:
            async with asyncio.timeout(self.timeout):
                return await self._fetch(url)
        except TimeoutError:
            raise ImageFetchFailed(f"fetching {url} took longer than {self.timeout}s", details={"url": url}) from None

    async def _fetch(self, url: str) -> bytes:
        current = url
        for _ in range(self.max_redirects + 1):
            target = self._parse(current)
            address = await self._checked_address(target)
            request = self._client.build_request(
                "GET",
                target.copy_with(host=address),
                headers={"Host": target.netloc.decode("ascii")},
                extensions={"sni_hostname": target.host} if target.scheme == "https" else None,
            )
            try:
                response = await self._client.send(request, stream=True)
            except httpx.HTTPError as exc:
                raise ImageFetchFailed(f"fetching {current} failed: {exc!r}", details={"url": current}) from None
            try:
                if response.status_code in _REDIRECTS and "location" in response.headers:
                    current = str(target.join(response.headers["location"]))
                    continue
                if not response.is_success:
                    raise ImageFetchFailed(
                        f"{current} answered HTTP {response.status_code}",
                        details={"url": current, "status": response.status_code},
                    )
                content_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
                if content_type.startswith(("text/", "application/json")):
                    raise ImageFetchFailed(
                        f"{current} returned {content_type!r}, not an image",
                        details={"url": current, "content_type": content_type},
                    )
                return await self._read_capped(response, current)
            finally:
                await response.aclose()
        raise ImageFetchFailed(
            f"{url} redirected more than {self.max_redirects} times", details={"url": url, "max": self.max_redirects}
        )

    def _parse(self, url: str) -> httpx.URL:
        try:
            target = httpx.URL(url)
        except (httpx.InvalidURL, TypeError, ValueError) as exc:
            raise UrlNotAllowed(f"not a valid URL: {exc}", details={"url": url}) from None
        if target.scheme not in ("http", "https"):
            raise UrlNotAllowed(f"scheme {target.scheme!r} is not allowed; use http or https", details={"url": url})
        if not target.host:
            raise UrlNotAllowed("URL has no host", details={"url": url})
        return target

    async def _checked_address(self, target: httpx.URL) -> str:
        host = target.host
        port = target.port or (443 if target.scheme == "https" else 80)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise ImageFetchFailed(f"cannot resolve {host!r}: {exc}", details={"host": host}) from None
        addresses = [str(info[4][0]) for info in infos]
        if not addresses:
            raise ImageFetchFailed(f"{host!r} resolves to no address", details={"host": host})
        exempt = self.allow_private or host.lower() in self.allowed_hosts
        if not exempt:
            blocked = [address for address in addresses if not is_public_address(address)]
            if blocked:
                raise UrlNotAllowed(
                    f"{host!r} resolves to a non-public address ({blocked[0]})",
                    details={"host": host, "addresses": blocked},
                )
        return addresses[0]

    async def _read_capped(self, response: httpx.Response, url: str) -> bytes:
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            raise PayloadTooLarge(
                f"{url} is {declared} bytes, over the limit of {self.max_bytes}",
                details={"limit": "max_image_bytes", "max_bytes": self.max_bytes},
            )
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > self.max_bytes:
                raise PayloadTooLarge(
                    f"{url} is over the limit of {self.max_bytes} bytes",
                    details={"limit": "max_image_bytes", "max_bytes": self.max_bytes},
                )
            chunks.append(chunk)
        return b"".join(chunks)
