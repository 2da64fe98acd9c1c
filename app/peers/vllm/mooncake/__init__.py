"""mmencode as the producer of vLLM's ``ECMooncakeConnector``: rows pushed into a consumer's memory.

:mod:`.control` speaks the consumer's control channel (reservations), :mod:`.transfer` wraps Mooncake's
transfer engine (the bytes), :mod:`.push` runs one push from reservation to completion and undoes it on
any failure. Mooncake itself is imported only when a push is configured (the ``mooncake`` extra).
"""
