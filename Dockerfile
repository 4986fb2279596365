# One image for the three services. Pick the service with the container's command:
#   tf-extender serve ...   scheduler extender (sidecar of kube-scheduler)
#   tf-webhook serve ...    mutating admission webhook
#   tf-certs generate ...   CA and serving certificates (init container / job)
#   tf-extender crds apply  the CRDs the image ships (/opt/venv/share/tensor-fusion-extender/crds)
#   kubectl-tf status ...   the kubectl plugin, for `kubectl exec` when it is not installed locally
#
# Multi-architecture without emulation (docs/release.md): the build stage runs on the build machine's
# platform whatever the target; it fetches the target's wheels (each checked against requirements.lock's
# hashes) and lays out the runtime files; nothing runs on the target's platform. `make release` builds
# linux/amd64 and linux/arm64 into one manifest list (buildah bud --platform ... --manifest).
#
# BASE_IMAGE: the runtime base, pinned by digest (the python:3.11-slim index, so each platform gets its own
# image); any image with python3.11 whose `python -m venv` works. BUILD_IMAGE: the build stage's (default
# the same). BUILDPLATFORM is set by BuildKit; buildah needs it as a build argument (tools/release.py passes
# it). The image tests build from bootstrapped Debian stand-ins (tests/harness/image.py).
ARG BASE_IMAGE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7
ARG BUILD_IMAGE=${BASE_IMAGE}
ARG VERSION=0.0.0

# The target's base: only its file system is used, nothing runs in it. (The instruction keeps buildah from
# leaving the stage's working container behind, as it does for an empty stage.)
FROM ${BASE_IMAGE} AS base
ARG BASE_IMAGE
LABEL org.opencontainers.image.base.name="${BASE_IMAGE}"

FROM --platform=${BUILDPLATFORM} ${BUILD_IMAGE} AS build
ARG TARGETARCH
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements.lock tools/imagebuild.py ./
# Exactly the locked versions, each file checked against its hash, so two builds of one commit install the
# same packages; in a layer of their own, so a rebuild after a source change reuses it.
RUN python imagebuild.py wheels --lock requirements.lock --arch "${TARGETARCH}" --out /wheels
COPY pyproject.toml README.md ./
COPY extender ./extender
COPY webhook ./webhook
COPY certs ./certs
COPY kubectl_tf ./kubectl_tf
# Then the project, into a virtual environment without pip or setuptools, and every entry point's
# --version where the target runs here (the build fails on a missing or broken one).
RUN python imagebuild.py venv --wheels /wheels --arch "${TARGETARCH}" --project /src --venv /opt/venv \
 && python imagebuild.py check /opt/venv --arch "${TARGETARCH}" tf-extender tf-webhook tf-certs kubectl-tf \
    kubectl_complete-tf
# The base's files without pip, setuptools and their bundled wheels, and the runtime user 65532.
COPY --from=base / /rootfs/
RUN python imagebuild.py rootfs /rootfs

FROM scratch
ARG VERSION
ARG BASE_IMAGE
COPY --from=build /rootfs/ /
COPY --from=build /opt/venv /opt/venv
COPY manifests/crds/tensor-fusion.ai_*.yaml /opt/venv/share/tensor-fusion-extender/crds/
LABEL org.opencontainers.image.title="tensor-fusion-extender" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      org.opencontainers.image.description="Fractional GPU placement for Kubernetes: scheduler extender and admission webhook"
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 65532:65532
EXPOSE 8080 9443
CMD ["tf-extender", "serve"]
