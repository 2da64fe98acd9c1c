"""API keys grouped into tenants: how entries are read, refused, and turned into cache scopes."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from mmencode.app.config import Settings
from mmencode.app.http.auth import ApiKeyMiddleware, tenant_scope
from mmencode.app.metrics import Metrics


def test_entries_name_their_tenant_before_the_first_colon(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# tenants\nacme:from-file\nplain-from-file\n")
    settings = Settings(api_key="acme:k1, bolt:k2:with-colon,bare", api_key_file=key_file)  # type: ignore[arg-type]
    assert settings.api_key_tenants() == {
        "k1": "acme",
        "k2:with-colon": "bolt",
        "bare": None,
        "from-file": "acme",
        "plain-from-file": None,
    }
    assert settings.api_keys() == ["k1", "k2:with-colon", "bare", "from-file", "plain-from-file"]
    assert settings.scoped_by_tenant()
    assert not Settings(api_key="k", cache_scope="global").scoped_by_tenant()  # type: ignore[arg-type]
    assert not Settings().scoped_by_tenant()


@pytest.mark.parametrize(
    ("entries", "problem"),
    [(":key", "empty tenant or key"), ("acme:", "empty tenant or key"), ("acme:k,bolt:k", "another tenant")],
)
def test_malformed_entries_stop_the_start_without_naming_the_key(entries: str, problem: str) -> None:
    with pytest.raises(ValidationError) as refused:
        Settings(api_key=entries)  # type: ignore[arg-type]
    # What `mmencode serve` prints: the messages, without the input values (app/cli.py).
    messages = " ".join(error["msg"] for error in refused.value.errors(include_input=False))
    assert problem in messages
    assert "bolt:k" not in messages and "acme:k" not in messages


def test_a_tenant_scope_needs_keys() -> None:
    with pytest.raises(ValidationError, match="cache_scope tenant needs API keys"):
        Settings(cache_scope="tenant")


def test_scopes_are_per_tenant_digests() -> None:
    assert tenant_scope("acme", "k1") == tenant_scope("acme", "k2") != tenant_scope("bolt", "k1")
    assert tenant_scope(None, "k1") != tenant_scope(None, "k2")
    assert tenant_scope(None, "acme") != tenant_scope("acme", "x")  # a bare key is never a named tenant
    assert "k1" not in tenant_scope(None, "k1") and len(tenant_scope(None, "k1")) == 32


def test_the_middleware_matches_every_key_to_its_tenants_scope() -> None:
    async def app(scope: object, receive: object, send: object) -> None:
        pass

    middleware = ApiKeyMiddleware(app, {"k1": "acme", "k2": "acme", "k3": None}, Metrics(), scope_by_tenant=True)
    assert middleware._match("Bearer k1") == middleware._match("Bearer k2") == tenant_scope("acme", "k1")
    assert middleware._match("Bearer k3") == tenant_scope(None, "k3")
    assert not isinstance(middleware._match("Bearer nope"), str)
