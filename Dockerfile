# One image for the three services. Pick the service with the container's command:
#   tf-extender serve ...   scheduler extender (sidecar of kube-scheduler)
#   tf-webhook serve ...    mutating admission webhook
#   tf-certs generate ...   CA and serving certificates (init container / job)

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
COPY extender ./extender
COPY webhook ./webhook
COPY certs ./certs
# Exactly the locked versions, each file checked against its hash, so two builds of one commit install the
# same packages; then the project alone (its build backend is in the lock too).
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --require-hashes -r requirements.lock \
 && /opt/venv/bin/pip install --no-deps --no-build-isolation .

FROM python:3.11-slim
LABEL org.opencontainers.image.title="tensor-fusion-extender" \
      org.opencontainers.image.description="Fractional GPU placement for Kubernetes: scheduler extender and admission webhook"
RUN groupadd --system --gid 65532 tensorfusion \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin tensorfusion
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# Fail the build if any entry point is missing or broken.
RUN tf-extender --help >/dev/null && tf-webhook --help >/dev/null && tf-certs --help >/dev/null
USER 65532:65532
EXPOSE 8080 9443
CMD ["tf-extender", "serve"]
