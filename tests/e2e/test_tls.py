"""``--ssl-certfile``/``--ssl-keyfile``: the CLI serves HTTPS, checked on loopback with a throwaway CA."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import trustme

from tests.helpers import data_uri, free_port, noise_image


def test_serve_speaks_tls_with_the_given_certificate(tmp_path: Path, checkpoints: dict[str, Path]) -> None:
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile, cafile = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    certificate.cert_chain_pems[0].write_to_path(str(certfile))
    certificate.private_key_pem.write_to_path(str(keyfile))
    authority.cert_pem.write_to_path(str(cafile))

    port = free_port()
    env = {**os.environ, "MMENCODE_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    command = [
        sys.executable, "-m", "mmencode", "serve", "--model", str(checkpoints["clip"]), "--port", str(port),
        "--ssl-certfile", str(certfile), "--ssl-keyfile", str(keyfile),
    ]  # fmt: skip
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"https://127.0.0.1:{port}"
    verified = ssl.create_default_context(cafile=str(cafile))
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/ready", verify=verified, timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and process.poll() is None, "the HTTPS server never became ready"
            time.sleep(0.2)

        response = httpx.post(
            url + "/v1/encode", json={"items": [{"image": data_uri(noise_image(64, 64))}]}, verify=verified, timeout=60
        )
        assert response.status_code == 200, response.text
        assert response.json()["items"][0]["num_tokens"] == 65  # CLIP: 8x8 patches + the class token

        # The certificate is the one given: a client that does not trust its CA refuses it ...
        try:
            httpx.get(url + "/health", timeout=5)
            raise AssertionError("an untrusted certificate was accepted")
        except httpx.ConnectError as exc:
            assert "CERTIFICATE_VERIFY_FAILED" in str(exc)
        # ... and nothing answers in plain HTTP on that port.
        try:
            plain = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
            assert plain.status_code != 200
        except httpx.HTTPError:
            pass
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
