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
ARG BASE_IMAGE=nvcr.io/nvidia/tensorflow:25.02-tf2-py3
FROM ${BASE_IMAGE}

ARG DISTRAIN_VERSION=0.1.0
LABEL org.opencontainers.image.title="distrain" \
      org.opencontainers.image.description="Run one unmodified Keras train.py on one GPU, a node, or many nodes (MWM or Horovod)" \
      org.opencontainers.image.version="${DISTRAIN_VERSION}" \
      org.opencontainers.image.source="https://github.com/distrain/distrain" \
      org.opencontainers.image.licenses="Apache-2.0"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY pyproject.toml README.md /opt/distrain/
COPY entrypoint /opt/distrain/entrypoint
# Into site-packages (not PYTHONPATH/WORKDIR: Apptainer ignores WORKDIR). --no-build-isolation: the base's
# setuptools builds it, so a base that already has typer and spython needs no network. tf-keras (legacy Keras,
# see README) only when the base lacks it, matching the base's TensorFlow, with --no-deps so TensorFlow stays.
# hadolint ignore=DL3013
RUN export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
 && python3 -m pip install --no-cache-dir --no-build-isolation /opt/distrain \
 && (python3 -c "import tf_keras" 2>/dev/null \
     || python3 -m pip install --no-cache-dir --no-deps \
          "tf-keras==$(python3 -c 'import tensorflow as tf; print(tf.__version__.rsplit(".", 1)[0])').0") \
 && TF_CPP_MIN_LOG_LEVEL=2 DISTRAIN_REQUIRE_GPU=0 distrain doctor \
 && useradd --create-home --uid 1000 --shell /bin/bash distrain \
 && mkdir -p /workspace && chmod 1777 /workspace

ENV DISTRAIN_REQUIRE_GPU=1
WORKDIR /workspace
USER 1000:1000
ENTRYPOINT ["distrain"]
CMD ["--help"]
