# MLflow tracking server image: mlflow, the PostgreSQL driver and boto3 (s3:// artifacts), at the
# versions of the project lock, so server and clients (training images) run the same MLflow.
# The project itself is not installed: the server never imports mmlinks code.
#
# Build context: the repository root (mlflow-server.Dockerfile.dockerignore is the ignore list):
#   docker build -f infra/docker/mlflow-server.Dockerfile -t "$IMAGE_REPOSITORY/mlflow-server:$IMAGE_TAG" .
FROM python:3.11.13-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

WORKDIR /opt/mlflow
COPY pyproject.toml constraints.txt ./
COPY infra/docker/extra-constraints.txt infra/docker/extra-constraints.txt
RUN pip install -c constraints.txt -c infra/docker/extra-constraints.txt mlflow psycopg2-binary boto3 \
 && python -c "import mlflow, psycopg2, boto3; assert mlflow.__version__ == '3.17.2', mlflow.__version__" \
 && useradd --uid 10001 --gid 0 --create-home --shell /usr/sbin/nologin mlflow

USER 10001
EXPOSE 5000
# Settings come from the environment (MLFLOW_BACKEND_STORE_URI, MLFLOW_ARTIFACTS_DESTINATION,
# MLFLOW_SERVER_ALLOWED_HOSTS; PGPASSWORD and AWS_* from secrets); see infra/k8s/mlflow.
CMD ["mlflow", "server", "--host", "0.0.0.0", "--port", "5000", "--serve-artifacts"]
