# Beam SDK worker image for mmlinks (Dataflow --sdk_container_image, Flink
# --environment_type=DOCKER --environment_config=IMAGE, or a Flink worker pool with --worker_pool).
# The official Beam Python 3.11 SDK image of the locked Beam version, plus this project and its
# locked dependencies, including the CUDA build of torch for GPU feature extraction.
#
# Build context: the repository root (Docker uses beam-worker.Dockerfile.dockerignore next to this
# file as the context's ignore list):
#   docker build -f infra/docker/beam-worker.Dockerfile -t "$IMAGE_REPOSITORY/beam-worker:$IMAGE_TAG" .
FROM apache/beam_python3.11_sdk:2.77.0

# LD_LIBRARY_PATH: where Dataflow's install-nvidia-driver places the driver libraries on GPU
# workers (harmless elsewhere); the CUDA runtime itself comes with the torch wheels of the lock.
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LD_LIBRARY_PATH=/usr/local/nvidia/lib64

WORKDIR /opt/mmlinks

# 1. The pinned dependency set first: this large layer is rebuilt only when the lock changes.
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
 && pip install -c constraints.txt -r /tmp/requirements.txt \
 && python -c "import apache_beam; assert apache_beam.__version__ == '2.77.0', apache_beam.__version__"

# 2. The project itself (same lock; nothing new is resolved here).
COPY README.md ./
COPY schemas/ schemas/
COPY pipelines/ pipelines/
COPY training/ training/
COPY archive/ archive/
COPY models/ models/
COPY orchestration/ orchestration/
COPY infra/__init__.py infra/__init__.py
RUN pip install -c constraints.txt . \
 && python -c "import pipelines.build, torch; print('mmlinks beam worker, torch', torch.__version__)"

# Non-root at run time. Older Dataflow releases required the SDK container to run as root (they
# mount /var/opt/google root-owned); if workers fail with "permission denied" there, rebuild with
# --build-arg WORKER_USER=0 (see infra/README.md). The entrypoint stays Beam's /opt/apache/beam/boot.
ARG WORKER_USER=10001
RUN useradd --uid 10001 --gid 0 --create-home --shell /usr/sbin/nologin mmlinks
USER ${WORKER_USER}
