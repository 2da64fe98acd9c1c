"""``/docs`` and ``/redoc`` work without internet: every asset they load comes from the service itself.

Contract tests over ASGI (``qwen_app``): pages and assets, no socket needed."""

from __future__ import annotations

import re

import httpx
import pytest

# src="...", href="...", url: '...', spec-url="...": whatever the page makes the browser fetch.
_REFERENCES = re.compile(r"""(?:src|href|spec-url)=["']([^"']+)["']|\burl:\s*["']([^"']+)["']""")


@pytest.mark.parametrize(("page", "bundle_marker"), [("/docs", "SwaggerUIBundle"), ("/redoc", "Redoc")])
async def test_the_page_references_no_outside_host_and_its_assets_are_served(
    qwen_app: httpx.AsyncClient, page: str, bundle_marker: str
) -> None:
    html = (await qwen_app.get(page)).text
    assert "://" not in html, "an absolute URL: the page would need another host"
    references = [a or b for a, b in _REFERENCES.findall(html)]
    assert any(ref.endswith(".js") for ref in references) and "/openapi.json" in references
    for reference in references:
        assert reference.startswith("/"), reference
        response = await qwen_app.get(reference)
        assert response.status_code == 200, reference
        assert len(response.content) > 0
        if reference.endswith(".js"):
            assert "javascript" in response.headers["content-type"]
            assert bundle_marker in response.text
            assert len(response.content) > 500_000  # the real bundle, not a stub
        if reference.endswith(".css"):
            assert response.headers["content-type"].startswith("text/css")


async def test_swagger_ui_does_not_call_the_online_validator(qwen_app: httpx.AsyncClient) -> None:
    assert '"validatorUrl": null' in (await qwen_app.get("/docs")).text
