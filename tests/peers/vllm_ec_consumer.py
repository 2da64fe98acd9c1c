"""vLLM's encoder-cache consumer, run with the peers venv's Python (vllm 0.34.0, --no-deps).

Builds ``ECExampleConnector`` as a language instance started with ``--ec-transfer-config
'{"ec_connector": "ECExampleConnector", "ec_role": "ec_consumer", "ec_connector_extra_config":
{"shared_storage_path": DIR}}'`` would: its scheduler-side instance answers ``has_cache_item`` for each
hash, its worker-side instance loads them with ``start_load_caches`` into an encoder cache. Writes
``{"found": {hash: bool}, "loaded": {hash: tensor}}`` to OUT with ``torch.save``.

A full ``VllmConfig`` cannot be built without a GPU build of vLLM (it infers a device); the connector
reads only ``ec_transfer_config`` (a real ``ECTransferConfig``) and ``model_config`` from it, so a
namespace carries those two. ``VLLM_TARGET_DEVICE=cpu`` makes vLLM's platform CPU, the device it
loads to.

usage: VLLM_TARGET_DEVICE=cpu python vllm_ec_consumer.py DIR OUT HASH...
"""

from __future__ import annotations

import sys
import types

import torch
from vllm.config.ec_transfer import ECTransferConfig
from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
from vllm.distributed.ec_transfer.ec_connector.example_connector import (
    ECExampleConnector,
    ECExampleConnectorMetadata,
    MMMeta,
)


def main() -> None:
    storage, out, hashes = sys.argv[1], sys.argv[2], sys.argv[3:]
    transfer = ECTransferConfig(
        ec_connector="ECExampleConnector",
        ec_role="ec_consumer",
        ec_connector_extra_config={"shared_storage_path": storage},
    )
    config = types.SimpleNamespace(ec_transfer_config=transfer, model_config=None)
    scheduler_side = ECExampleConnector(config, ECConnectorRole.SCHEDULER)  # type: ignore[arg-type]
    worker_side = ECExampleConnector(config, ECConnectorRole.WORKER)  # type: ignore[arg-type]
    assert scheduler_side.is_consumer and not scheduler_side.is_producer
    found = {h: scheduler_side.has_cache_item(h) for h in hashes}
    metadata = ECExampleConnectorMetadata()
    for h in hashes:
        if found[h]:
            metadata.add_mm_data(MMMeta.make_meta(h, 0))
    worker_side.bind_connector_metadata(metadata)
    encoder_cache: dict[str, torch.Tensor] = {}
    worker_side.start_load_caches(encoder_cache)
    torch.save({"found": found, "loaded": encoder_cache}, out)


if __name__ == "__main__":
    main()
