# The gateway image (also runs `crossway migrate`): HTTP service, policies and migrations, no GPU.
# Build from the repository root: docker build -f docker/gateway.Dockerfile .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# torch's CPU build first (for the small in-process engine); an unpinned torch would pull the
# multi-GB CUDA build, which the gateway never uses.
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml README.md ./
COPY gateway/ gateway/
COPY selfhost/ selfhost/
COPY kernels/ kernels/
COPY policies/ policies/
COPY migrations/ migrations/

# Editable, so the code finds policies/ and migrations/ beside its packages under /app.
RUN pip install --no-cache-dir -e .

RUN useradd --create-home --uid 10001 crossway
USER crossway

EXPOSE 8080
CMD ["crossway", "serve", "--host", "0.0.0.0", "--port", "8080"]
