"""The shims .venv-sglang needs to serve on this CPU-only machine, applied by ``make sglang-env``.

For a test oracle's environment only (SGLang 0.5.23 on torch 2.13.0+cpu, with no sgl-kernel wheel for
the CPU), never for mmencode's own. Run with the venv's own Python after the pinned requirements are
installed; idempotent (a second run rewrites the same files and finds the text patch already applied).

usage: .venv-sglang/bin/python bench/peers/sglang/shims.py

What it installs into the venv's site-packages:
  1. sgl_kernel/__init__.py      a stand-in for the sgl-kernel (sglang-kernel) package
  2. _sglang_cpu_shim.py + .pth  a lazy import hook that loads (1) before any sglang.srt.models module
  3. torchvision/_meta_registrations.py  two fake-op registrations skipped
Each is for a test oracle's environment only: nothing here makes SGLang's CUDA kernels work.
"""

from __future__ import annotations

import importlib
import re
import site
from pathlib import Path

# ---------------------------------------------------------------------------------------------
# 1. The stand-in sgl_kernel package.
#
# PyPI has no CPU wheel of sgl-kernel (sglang-kernel 0.4.x is CUDA only), yet SGLang imports it from
# ~131 sites, most at module level (`from sgl_kernel import X`, `from sgl_kernel.sub import Y`,
# `import sgl_kernel`), and some under `if _is_cpu:` (kernels/ops/kvcache/cache_move.py). On CPU,
# with the torch_native attention backend and the layers' forward_native paths, none of those
# kernels is *called*, so every attribute and every submodule resolves to a stub that raises only
# when called.
#
# Exceptions, deliberately left missing:
#   * `sgl_kernel.scalar_type` raises ImportError: srt/layers/quantization/utils.py (get_scalar_types)
#     falls back to SGLang's own ScalarType only on ImportError; a stub would be used as the real one.
#   * dunder attributes (__path__ aside) raise AttributeError, so inspect/pickle/hasattr probes act
#     as on an ordinary module.
#   * nothing is registered in torch.ops.sgl_kernel except the four names below, so
#     `hasattr(torch.ops.sgl_kernel, "convert_weight_packed")` stays False and
#     srt/utils/common.py cpu_has_amx_support() stays False (no AMX kernels are tried).
#
# torch.ops.sgl_kernel: srt/models/qwen3_5.py reads four ops at import time under `if _is_cpu:`, and
# it is imported by the Qwen-VL multimodal processor (so by every Qwen-VL server). They get a schema
# and a kernel that raises when called. srt/models/muse_glimmer.py reads one of the same names.
# ---------------------------------------------------------------------------------------------
SGL_KERNEL_INIT = '''"""Stand-in for sgl-kernel on a CPU-only machine (written by bench/peers/sglang/shims.py).

Every attribute and every submodule is a stub that raises only when called; see shims.py."""

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+cpu.stub"
_MISSING_SUBMODULES = {"sgl_kernel.scalar_type"}  # quantization/utils.py falls back on ImportError
_MISSING_ATTRS = {"scalar_type"}


class _Stub:
    """A kernel that does not exist here: importable, callable only to raise."""

    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self._name}: sgl-kernel is a CPU stand-in here (no such kernel)")

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Stub(f"{self._name}.{attr}")

    def __repr__(self):
        return f"<sgl_kernel stub {self._name}>"


def _module_getattr(modname):
    def __getattr__(attr):
        if attr.startswith("__") or attr in _MISSING_ATTRS:
            raise AttributeError(f"module {modname!r} has no attribute {attr!r}")
        return _Stub(f"{modname}.{attr}")

    return __getattr__


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []
        module.__getattr__ = _module_getattr(module.__name__)


class _StubFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("sgl_kernel.") or fullname in _MISSING_SUBMODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)


if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _StubFinder())

__getattr__ = _module_getattr(__name__)


def _register_torch_ops():
    import torch

    names = (
        "fused_sigmoid_mul_cpu",
        "fused_qk_gemma_rmsnorm_cpu",
        "fused_qk_gemma_rmsnorm_with_gate_cpu",
        "fused_qkvzba_split_reshape_cat_contiguous_cpu",
    )
    missing = [n for n in names if not hasattr(torch.ops.sgl_kernel, n)]
    if not missing:
        return
    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    for name in missing:
        lib.define(f"{name}(Tensor[] args) -> ()")

        def _raise(*args, _name=name, **kwargs):
            raise NotImplementedError(f"torch.ops.sgl_kernel.{_name}: CPU stand-in (no such kernel)")

        lib.impl(name, _raise, "CompositeExplicitAutograd")
    globals()["_torch_library"] = lib  # keep the registrations alive


_register_torch_ops()
'''

# ---------------------------------------------------------------------------------------------
# 2. The lazy hook. srt/models/qwen3_5.py reads torch.ops.sgl_kernel.* at import time, and only
# importing sgl_kernel (1) registers those names. Rather than trusting that some earlier module
# happened to import sgl_kernel first, a meta-path finder (installed by a .pth file, so in every
# process SGLang spawns) imports sgl_kernel once, right before the first sglang.srt.models.* module
# is found. It imports nothing (torch included) in processes that never touch sglang.srt.models,
# so pip and other tools in this venv start as fast as before.
# ---------------------------------------------------------------------------------------------
HOOK_MODULE = '''"""Imports the sgl_kernel stand-in before SGLang's model modules (written by shims.py)."""

import sys


class _LoadSglKernelFirst:
    _done = False

    def find_spec(self, fullname, path=None, target=None):
        if not self._done and fullname.startswith("sglang.srt.models"):
            type(self)._done = True
            import sgl_kernel  # noqa: F401  (registers the torch.ops.sgl_kernel stand-ins)
        return None


if not any(type(f).__name__ == "_LoadSglKernelFirst" for f in sys.meta_path):
    sys.meta_path.insert(0, _LoadSglKernelFirst())
'''
PTH_LINE = "import _sglang_cpu_shim\n"


def install_sgl_kernel_stub(site_packages: Path) -> None:
    pkg = site_packages / "sgl_kernel"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text(SGL_KERNEL_INIT)
    (site_packages / "_sglang_cpu_shim.py").write_text(HOOK_MODULE)
    (site_packages / "zz_sglang_cpu_shim.pth").write_text(PTH_LINE)


# ---------------------------------------------------------------------------------------------
# 3. torchvision. PyPI's torchvision==0.28.0 (the release paired with torch 2.13) is a CUDA build:
# its C ops do not load on the CPU-only torch, and `torch.library.register_fake("torchvision::nms")`
# then raises "operator torchvision::nms does not exist" at `import torchvision`. SGLang's Qwen-VL
# processors (transformers' fast image processors) need only torchvision's Python transforms, which
# work once those two fake registrations are skipped; nms/qnms stay unusable (nothing here calls
# them). Same trick as bench/peers/vllm/shims.py.
# ---------------------------------------------------------------------------------------------
def skip_torchvision_fake_nms(site_packages: Path) -> None:
    path = site_packages / "torchvision" / "_meta_registrations.py"
    text = path.read_text()
    for op in ("nms", "qnms"):
        decorator = f'@torch.library.register_fake("torchvision::{op}")'
        shim = f"@(lambda fn: fn)  # mmencode test-oracle shim (bench/peers/sglang/shims.py): was {decorator}"
        # Anchored to whole lines, so a second run leaves the shimmed line alone (idempotent).
        text = re.sub(rf"^{re.escape(decorator)}$", lambda _, shim=shim: shim, text, flags=re.MULTILINE)
    path.write_text(text)


def main() -> None:
    site_packages = Path(site.getsitepackages()[0])
    install_sgl_kernel_stub(site_packages)
    skip_torchvision_fake_nms(site_packages)
    importlib.invalidate_caches()

    # Self-check: the stand-in behaves as described above.
    import sgl_kernel
    import torch
    import torchvision.transforms.v2.functional
    from sgl_kernel.flash_attn import flash_attn_varlen_func  # noqa: F401  (a stub submodule)

    try:
        import sgl_kernel.scalar_type
    except ImportError:
        pass
    else:
        raise AssertionError("sgl_kernel.scalar_type must raise ImportError")
    assert hasattr(torch.ops.sgl_kernel, "fused_sigmoid_mul_cpu")
    assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")
    from sglang.srt.utils.common import cpu_has_amx_support

    assert not cpu_has_amx_support()
    print(
        "shims ok: torch",
        torch.__version__,
        "torchvision",
        torchvision.__version__,
        "sgl_kernel",
        sgl_kernel.__version__,
    )


if __name__ == "__main__":
    main()
