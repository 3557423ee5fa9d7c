# Dagster image for mmlinks: the code location (gRPC server on port 4000 serving the module
# orchestration.definitions), and the same image runs dagster-webserver and dagster-daemon so all
# three share one Dagster version. Runs launched by the DefaultRunLauncher execute inside the code
# location container, so the project (mmlinks CLI, Beam, Ray client, MLflow) is installed here too.
#
# Build context: the repository root (dagster.Dockerfile.dockerignore is the ignore list):
#   docker build -f infra/docker/dagster.Dockerfile -t "$IMAGE_REPOSITORY/dagster:$IMAGE_TAG" .
FROM python:3.11.13-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DAGSTER_HOME=/opt/dagster/dagster_home

WORKDIR /opt/mmlinks

# 1. The pinned dependency set first (project dependencies + Dagster's PostgreSQL storage).
COPY pyproject.toml constraints.txt ./
COPY infra/docker/extra-constraints.txt infra/docker/extra-constraints.txt
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
 && pip install -c constraints.txt -c infra/docker/extra-constraints.txt -r /tmp/requirements.txt dagster-postgres \
 && python -c "import dagster, dagster_postgres; assert dagster.__version__ == '1.13.27', dagster.__version__"

# 2. The project itself (the code location module orchestration.definitions lives in it).
COPY README.md ./
COPY schemas/ schemas/
COPY pipelines/ pipelines/
COPY training/ training/
COPY archive/ archive/
COPY models/ models/
COPY orchestration/ orchestration/
COPY infra/__init__.py infra/__init__.py
RUN pip install -c constraints.txt -c infra/docker/extra-constraints.txt . \
 && useradd --uid 10001 --gid 0 --create-home --shell /usr/sbin/nologin dagster \
 && mkdir -p "$DAGSTER_HOME" /opt/dagster/workspace \
 && chown -R 10001:0 /opt/dagster

USER 10001
EXPOSE 4000 3000
# The code location; the webserver and daemon Deployments override the command.
CMD ["dagster", "api", "grpc", "-m", "orchestration.definitions", "-h", "0.0.0.0", "-p", "4000"]
