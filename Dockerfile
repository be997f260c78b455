# The capstones' image: a CUDA runtime, Python, this repository installed (editable, in /app),
# and nvcc, because project01's and project04's kernels are compiled on first use
# (`shared.cuda_build`, into $CUDA_EXT_BUILD_DIR). What the KubeRay manifests
# (project03_capstone_infra/deploy/kuberay) and a GPU runner pull:
#
#   docker build -t ghcr.io/your-org/ai-infra-capstones:latest .
#   docker run --gpus all --network host -v "$PWD/models:/app/models" \
#     ghcr.io/your-org/ai-infra-capstones:latest \
#     python -m project04_llm_inference serve models/Llama-3.2-1B-Instruct
#
# CUDA_VERSION, CUDA_PKG and TORCH_INDEX go together (the toolkit that compiles the kernels is
# the one torch was built with); RAY_VERSION must be the rayVersion the KubeRay manifests name
# (empty: whatever the ray extra resolves to).
ARG CUDA_VERSION=12.8.1
FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04

ARG CUDA_PKG=12-8
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG EXTRAS=ray
ARG RAY_VERSION=2.60.0

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/cuda/bin:$PATH \
    CUDA_HOME=/usr/local/cuda \
    CUDA_EXT_BUILD_DIR=/app/.build

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev g++ ninja-build ca-certificates \
        "cuda-nvcc-${CUDA_PKG}" "cuda-cudart-dev-${CUDA_PKG}" \
    && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv /opt/venv \
    && pip install --index-url "${TORCH_INDEX}" "torch>=2.6"

WORKDIR /app
# the packages first, then the rest: a change to tests or reports does not reinstall
COPY pyproject.toml README.md LICENSE ./
COPY shared ./shared
COPY project01_cuda_kernel ./project01_cuda_kernel
COPY project02_fsdp_scaling ./project02_fsdp_scaling
COPY project03_capstone_infra ./project03_capstone_infra
COPY project04_llm_inference ./project04_llm_inference
COPY apple_track ./apple_track
RUN pip install -e ".[${EXTRAS}]" ${RAY_VERSION:+"ray[tune]==${RAY_VERSION}"}
COPY . .

RUN useradd --create-home --uid 1000 app && mkdir -p /app/.build /app/runs /app/models \
    && chown -R app:app /app
USER 1000:1000

EXPOSE 8000
CMD ["python", "-m", "project04_llm_inference", "--help"]
