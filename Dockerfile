# mmencode on a CUDA host: PyPI's Linux torch wheel carries its own CUDA runtime; the host needs
# only the NVIDIA driver and the container toolkit.
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    MMENCODE_CACHE_DIR=/var/cache/mmencode

WORKDIR /srv/mmencode
# What Mooncake's transfer engine loads (the mooncake extra below: pushes into vLLM's ECMooncakeConnector),
# over TCP or RDMA alike.
RUN apt-get update && apt-get install -y --no-install-recommends libibverbs1 libnl-3-200 libnl-route-3-200 \
    && rm -rf /var/lib/apt/lists/*
# torch and torchvision first, pinned as a pair, so the layer is reused when only the service changes.
RUN pip install "torch==2.14.1" "torchvision==0.29.1"
COPY pyproject.toml README.md ./
COPY app ./app
COPY models ./models
COPY schemas ./schemas
# The package's root; pyproject.toml installs the three folders above under it, so a user's `app` is never shadowed.
COPY mmencode ./mmencode
# The extras: PyAV (FFmpeg inside its wheel) for video and audio items, soxr for audio, and Mooncake's transfer
# engine (~140 MB) for --upstream-transport mooncake; --build-arg MMENCODE_EXTRAS=video,audio leaves it out.
ARG MMENCODE_EXTRAS=video,audio,mooncake
RUN pip install ".[${MMENCODE_EXTRAS}]" && useradd --system --uid 10001 mmencode && mkdir -p /var/cache/mmencode \
    && chown mmencode /var/cache/mmencode
USER mmencode

EXPOSE 8000
CMD ["mmencode", "serve", "--host", "0.0.0.0", "--port", "8000"]
