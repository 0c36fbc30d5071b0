# distrain: a GPU TensorFlow + Horovod image whose entry decides the mode from the environment.
#   docker build -t distrain .                       docker run distrain plan
#   docker build --build-arg BASE_IMAGE=... .
#   docker run --rm --gpus all --shm-size=1g --user "$(id -u):$(id -g)" -v "$PWD:/workspace" \
#     -e DISTRAIN_OUTPUT_DIR=/workspace/distrain-output distrain train.py      (README: One machine with Docker)
#
# Base: NGC's TensorFlow 25.02 TF2 image, the last TF2 release NVIDIA published, reported to carry TensorFlow
# 2.17 with a Horovod 0.28.1 built for it (NCCL, Open MPI). distrain's tests use TensorFlow 2.17.1 for that
# reason. This could not be verified from the build machine (no nvcr.io access): `distrain doctor` (run by the
# Apptainer %test and below) prints what the base really holds. Tests build this file unchanged on a local
# CPU base image (scripts/build-test-base.sh).
# Keras: the base's own Keras 3 is kept (NGC 25.02: 3.3.2 next to tf_keras 2.17.0). distrain's Keras 3 fixes
# (entrypoint/compat) are proven with 3.3.2 and 3.15.1, and a Keras it does not know is refused at start-up.
# FLAVOUR=pypi: TensorFlow 2.21 with PyPI's CUDA 12 libraries, Keras 3.15, tf_keras and Horovod with NCCL, on a
# plain Debian 12, offline from wheelhouse/ (scripts/gpu-wheelhouse.sh fills it):
#   docker build --build-arg FLAVOUR=pypi --build-arg BASE_IMAGE=debian:12 -t distrain:pypi .
# (the wheelhouse stays in a layer of a Docker image: `distrain image build --flavour pypi` builds a SIF without).
ARG BASE_IMAGE=nvcr.io/nvidia/tensorflow:25.02-tf2-py3
FROM ${BASE_IMAGE}

ARG DISTRAIN_VERSION=0.1.0
ARG FLAVOUR=ngc
# what the base must carry, checked at the end of the install (image/expect.py): "flavour": the flavour's own
ARG EXPECT=flavour
LABEL org.opencontainers.image.title="distrain" \
      org.opencontainers.image.description="Run one unmodified Keras train.py on one GPU, a node, or many nodes (MWM or Horovod)" \
      org.opencontainers.image.version="${DISTRAIN_VERSION}" \
      org.opencontainers.image.source="https://github.com/distrain/distrain" \
      org.opencontainers.image.licenses="Apache-2.0" \
      distrain.flavour="${FLAVOUR}"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY pyproject.toml README.md /opt/distrain/
COPY entrypoint /opt/distrain/entrypoint
COPY image /opt/distrain/image
COPY wheelhouse /opt/distrain/wheelhouse
# The install steps, the same for Apptainer.def: image/install.sh.
RUN sh /opt/distrain/image/install.sh "${FLAVOUR}" "${EXPECT}" \
 && useradd --create-home --uid 1000 --shell /bin/bash distrain \
 && mkdir -p /workspace && chmod 1777 /workspace

# a mounted ~/.local would shadow the image's packages: `-e PYTHONNOUSERSITE=` reads it (entrypoint/user_site.py)
ENV DISTRAIN_REQUIRE_GPU=1 PYTHONNOUSERSITE=1
WORKDIR /workspace
USER 1000:1000
ENTRYPOINT ["distrain"]
CMD ["--help"]
