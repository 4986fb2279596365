# One image for the three services. Pick the service with the container's command:
#   tf-extender serve ...   scheduler extender (sidecar of kube-scheduler)
#   tf-webhook serve ...    mutating admission webhook
#   tf-certs generate ...   CA and serving certificates (init container / job)
#   kubectl-tf status ...   the kubectl plugin, for `kubectl exec` when it is not installed locally

# BASE_IMAGE: any image with python3.11 as `python` (with venv and pip) and groupadd/useradd; the image tests
# build from a bootstrapped Debian stand-in of it (tests/harness/image.py). VERSION: `make release` sets it.
ARG BASE_IMAGE=python:3.11-slim
ARG VERSION=0.0.0

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements.lock ./
# Exactly the locked versions, each file checked against its hash, so two builds of one commit install the
# same packages; in a layer of their own, so a rebuild after a source change reuses it.
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --require-hashes -r requirements.lock
COPY pyproject.toml README.md ./
COPY extender ./extender
COPY webhook ./webhook
COPY certs ./certs
COPY kubectl_tf ./kubectl_tf
# Then the project alone (its build backend is in the lock too).
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation .

FROM ${BASE_IMAGE}
ARG VERSION
LABEL org.opencontainers.image.title="tensor-fusion-extender" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.description="Fractional GPU placement for Kubernetes: scheduler extender and admission webhook"
RUN groupadd --system --gid 65532 tensorfusion \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin tensorfusion
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# Fail the build if any entry point is missing or broken.
RUN tf-extender --version && tf-webhook --version && tf-certs --version && kubectl-tf --version \
    && kubectl_complete-tf --help
USER 65532:65532
EXPOSE 8080 9443
CMD ["tf-extender", "serve"]
