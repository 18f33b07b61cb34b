# syntax=docker/dockerfile:1
# One image for every AgentGrad process: the store service, the dashboard, the model server, the
# capture proxy, runners and the trainer (deploy/compose.yaml and deploy/k8s/ run it).
#
#   docker build -t agentgrad:local .                                        # everything, CPU torch
#   docker build -t agentgrad-store:local --build-arg EXTRAS=server,postgres,redis --build-arg TORCH_VERSION= .
#
# EXTRAS are pyproject.toml's extras (server, postgres, redis, train, export, trackers, ...).
# TORCH_VERSION installs that torch from TORCH_INDEX_URL first, the CPU wheel by default, so no
# extra that needs torch can pull the CUDA build; empty: no torch (an image without `train`).
ARG PYTHON_VERSION=3.11
FROM python:${PYTHON_VERSION}-slim

ARG EXTRAS=server,postgres,train
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A fixed uid, so Kubernetes' runAsUser/fsGroup (deploy/k8s/) and volume ownership match it.
RUN useradd --create-home --uid 10001 --user-group agentgrad \
    && mkdir /runs && chown agentgrad:agentgrad /runs

RUN if [ -n "$TORCH_VERSION" ]; then \
        pip install "torch==${TORCH_VERSION}" --index-url "$TORCH_INDEX_URL"; \
    fi

WORKDIR /opt/agentgrad
COPY pyproject.toml README.md LICENSE ./
COPY src ./src
RUN pip install ".[${EXTRAS}]" && rm -rf src build
# The calculator demo's task files, for the trainer in deploy/ (your own image: COPY yours).
COPY deploy/tasks ./tasks

USER agentgrad
WORKDIR /home/agentgrad
# Every process of deploy/ names its full command line (`agentgrad store serve ...`).
CMD ["agentgrad", "--help"]
