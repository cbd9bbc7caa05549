# One image for the api, the migrate step and the GPU workers (the api never imports torch; workers need CUDA).
# The devel base ships nvcc, which DeepSpeed needs to JIT-compile its CUDA ops (fused_adam, cpu_adam) on first use.
ARG BASE_IMAGE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-devel
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TUNER_CACHE_DIR=/cache

WORKDIR /opt/tuner
COPY pyproject.toml ./
COPY tuner ./tuner
COPY trials ./trials
COPY api ./api
# torch comes from the base image (CUDA build); pip keeps it because it satisfies torch>=2.3.
RUN pip install . ninja

RUN useradd --create-home --uid 1000 tuner && mkdir -p /cache && chown tuner /cache
USER tuner
EXPOSE 8000
CMD ["tuner", "--help"]
