# CPU image:  docker build -t mmc .                                  (or `make image`)
# GPU image:  docker build --build-arg RUNTIME_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04@sha256:c3fde347d52d578c84fd644bc177bc7ec333feaf11550d990da4084d7612e4c7 -t mmc:gpu .
#             then  docker run --gpus all -p 8080:8080 mmc:gpu serve
# Run:        docker run -p 8080:8080 mmc serve                       the example models, loaded at start
#             docker run -p 8080:8080 -v $PWD/models:/opt/ml/models mmc serve        your models instead
#
# BASE_IMAGE gives Python 3.11 and, by default, the runtime too; both are pinned by digest.
ARG BASE_IMAGE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7
# A CUDA runtime base (NVIDIA's images set CUDA_VERSION) makes the GPU image: PyPI's CUDA 13 torch.
ARG RUNTIME_IMAGE=${BASE_IMAGE}

FROM ${BASE_IMAGE} AS python

FROM ${RUNTIME_IMAGE}
# Where torch's CPU build comes from; unset: requirements/install's default, PyTorch's CPU index.
ARG TORCH_INDEX_URL
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="multi-model inference container" \
      org.opencontainers.image.description="PyTorch models over SageMaker's multi-model contract, Triton V2 and TF Serving REST" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      com.amazonaws.sagemaker.capabilities.multi-models=true \
      com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true

# Python 3.11 where the runtime base has none (a CUDA base): the official image keeps it in /usr/local,
# copied in with the shared libraries its standard library links against. Mounted, not COPY'd: on the
# Python base itself a COPY would store a second copy of its /usr/local in a layer.
RUN --mount=type=bind,from=python,source=/usr/local,target=/mnt/python \
    python3 -c "import bz2, ctypes, lzma, sqlite3, ssl, uuid, zlib" 2>/dev/null \
    || (cp -a /mnt/python/. /usr/local/ && ldconfig && apt-get update \
        && apt-get install -y --no-install-recommends ca-certificates libbz2-1.0 libexpat1 libffi8 liblzma5 \
           libsqlite3-0 libssl3t64 libuuid1 zlib1g \
        && rm -rf /var/lib/apt/lists/*)

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv
# Dependencies first, in a layer of their own: a change to the code does not reinstall torch. Then
# what a server never runs goes, about 190 MB: torch's C++ test binaries and protoc (torch_shm_manager
# stays: `import torch` looks for it) and its C++ headers (there is no compiler here to use them).
COPY requirements/ /tmp/requirements/
RUN lock=server.lock; if [ -n "${CUDA_VERSION:-}" ]; then lock=server-cuda.lock; fi; \
    /tmp/requirements/install /opt/venv "/tmp/requirements/$lock" --no-compile \
    && torch=$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torch \
    && rm -r "$torch/test" "$torch/include" /tmp/requirements && find "$torch/bin" -type f ! -name torch_shm_manager -delete

# Not editable, no test extras, nothing resolved: the locked setuptools builds it, --no-deps installs it.
COPY pyproject.toml README.md LICENSE /tmp/source/
COPY container/ /tmp/source/container/
# Then bytecode, only for what the server and its handler workers import at start (the install above
# wrote none: for the whole environment it would be about 180 MB), and now, as the server's user
# cannot write it later.
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation --no-compile /tmp/source && rm -r /tmp/source \
    && /opt/venv/bin/python -c "import container.app, container.gunicorn_conf, container.gunicorn_worker, \
container.backends.forkserver, container.backends.handler_worker, gunicorn.app.wsgiapp, sagemaker_inference.decoder"

# The example models, built here so that no local torch is needed to try the image.
COPY examples/ /tmp/examples/
RUN mkdir -p /opt/ml && cp -r /tmp/examples/models /opt/ml/models \
    && /opt/venv/bin/python /tmp/examples/build_models.py /opt/ml/models && rm -r /tmp/examples

# A user of its own: it reads the models (world-readable, as SageMaker mounts them) and writes only
# under /tmp (archive extraction, requirements.txt installs) and its home.
RUN useradd --system --create-home --home-dir /home/server --uid 10001 server
COPY serve /usr/local/bin/serve
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    SERVE_LOAD_MODELS=*
USER server
WORKDIR /home/server
EXPOSE 8080 8001
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ping' % os.environ.get('SAGEMAKER_BIND_TO_PORT', '8080'), timeout=4)"]
# `docker run IMAGE serve` replaces CMD; serve execs gunicorn, which then receives SIGTERM itself.
CMD ["serve"]
