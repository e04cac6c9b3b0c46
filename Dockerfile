# CPU image (default):  docker build -t mmc .
# GPU image:            docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 -t mmc:gpu .
# Run:                  docker run -p 8080:8080 -v $PWD/models:/opt/ml/models mmc serve
FROM python:3.11-slim

# Where pip finds torch: the CPU build by default; a CUDA index makes the GPU image (the pin stays 2.13.0).
# Empty: the default index only (a local wheel mirror, say).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

LABEL com.amazonaws.sagemaker.capabilities.multi-models=true \
      com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

RUN apt-get update && apt-get install -y --no-install-recommends make \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/server
COPY pyproject.toml Makefile README.md serve ./
COPY container ./container
# The same install `make test` and `make serve` run.
RUN PIP_EXTRA_INDEX_URL="$TORCH_INDEX_URL" make install

ENV PATH=/opt/server:/opt/server/.venv/bin:$PATH
EXPOSE 8080
# `docker run IMAGE serve` replaces CMD; serve execs gunicorn, which then receives SIGTERM itself.
CMD ["serve"]
