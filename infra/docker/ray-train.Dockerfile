# Ray training image for mmlinks (KubeRay head and GPU workers, RayJob submitter): the official
# Ray image of the locked Ray version for Python 3.11 with CUDA, plus this project and its locked
# dependencies (torch/torchvision are the CUDA builds from PyPI, pinned in constraints.txt).
#
# Build context: the repository root (ray-train.Dockerfile.dockerignore is the ignore list):
#   docker build -f infra/docker/ray-train.Dockerfile -t "$IMAGE_REPOSITORY/ray-train:$IMAGE_TAG" .
FROM rayproject/ray:2.60.0-py311-gpu

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# The Ray images run as user "ray" (uid 1000, gid 100) with Python under /home/ray.
USER 1000
WORKDIR /home/ray/mmlinks

# 1. The pinned dependency set first: this large layer is rebuilt only when the lock changes.
COPY --chown=1000:100 pyproject.toml constraints.txt ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
 && pip install -c constraints.txt -r /tmp/requirements.txt \
 && python -c "import ray, torch; assert ray.__version__ == '2.60.0', ray.__version__; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

# 2. The project itself.
COPY --chown=1000:100 README.md ./
COPY --chown=1000:100 schemas/ schemas/
COPY --chown=1000:100 pipelines/ pipelines/
COPY --chown=1000:100 training/ training/
COPY --chown=1000:100 archive/ archive/
COPY --chown=1000:100 models/ models/
COPY --chown=1000:100 orchestration/ orchestration/
COPY --chown=1000:100 infra/__init__.py infra/__init__.py
RUN pip install -c constraints.txt . && mmlinks --help > /dev/null

USER 1000
