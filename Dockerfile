# CPU image:  docker build -t mmc .                                  (or `make image`)
# GPU image:  docker build --build-arg VARIANT=cuda -t mmc:gpu .      then  docker run --gpus all …
# Run:        docker run -p 8080:8080 mmc serve                       the example models, loaded at start
#             docker run -p 8080:8080 -v $PWD/models:/opt/ml/models mmc serve        your models instead
#
# Bases are pinned by digest; pass BASE_IMAGE / CUDA_BASE_IMAGE to move them (or to use a local mirror).
ARG BASE_IMAGE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7
ARG CUDA_BASE_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04@sha256:c3fde347d52d578c84fd644bc177bc7ec333feaf11550d990da4084d7612e4c7
# cpu: torch's CPU build; cuda: PyPI's CUDA 13 build on NVIDIA's CUDA runtime base.
ARG VARIANT=cpu

# Build stage: the virtual environment from the lock, the project, and the example models.
FROM ${BASE_IMAGE} AS build
ARG VARIANT
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv /opt/venv
WORKDIR /src
# Dependencies first, in a layer of their own: a change to the code does not reinstall torch.
COPY requirements/ requirements/
RUN lock=requirements/server.lock; if [ "$VARIANT" != cpu ]; then lock=requirements/server-$VARIANT.lock; fi; \
    TORCH_INDEX_URL="$TORCH_INDEX_URL" requirements/install /opt/venv "$lock"
COPY pyproject.toml README.md ./
COPY container/ container/
# Not editable, no test extras, nothing resolved: the locked setuptools builds it, --no-deps installs it.
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation . && rm -rf build
# The example models, built here so that no local torch is needed to try the image.
COPY examples/ examples/
RUN cp -r examples/models /opt/models && /opt/venv/bin/python examples/build_models.py /opt/models

# Runtime bases. Only the one VARIANT names is built.
FROM ${BASE_IMAGE} AS runtime-cpu

FROM ${CUDA_BASE_IMAGE} AS runtime-cuda
# The CUDA base has no Python 3.11: take the build stage's interpreter (the official image keeps it in
# /usr/local) and the shared libraries its standard library links against.
COPY --from=build /usr/local /usr/local
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libssl3t64 libffi8 libsqlite3-0 \
        libbz2-1.0 liblzma5 zlib1g libexpat1 libuuid1 \
    && rm -rf /var/lib/apt/lists/* && ldconfig

FROM runtime-${VARIANT}
ARG VARIANT
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="multi-model inference container" \
      org.opencontainers.image.description="PyTorch models over SageMaker's multi-model contract, Triton V2 and TF Serving REST (${VARIANT})" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      com.amazonaws.sagemaker.capabilities.multi-models=true \
      com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true

# A user of its own: it reads the models (world-readable, as SageMaker mounts them) and writes only
# under /tmp (archive extraction, requirements.txt installs) and its home.
RUN useradd --system --create-home --home-dir /home/server --uid 10001 server
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/models /opt/ml/models
COPY serve /usr/local/bin/serve
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    SERVE_LOAD_MODELS=*
USER server
WORKDIR /home/server
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ping' % os.environ.get('SAGEMAKER_BIND_TO_PORT', '8080'), timeout=4)"]
# `docker run IMAGE serve` replaces CMD; serve execs gunicorn, which then receives SIGTERM itself.
CMD ["serve"]
