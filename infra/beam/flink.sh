#!/usr/bin/env bash
# Build an mmlinks dataset with Apache Beam on a Flink cluster (portable FlinkRunner). The Python
# code runs in the mmlinks worker image (infra/docker/beam-worker.Dockerfile): by default the
# TaskManagers start it with Docker (--environment_type=DOCKER --environment_config=IMAGE); on
# Kubernetes run it as a worker-pool sidecar next to each TaskManager
# (image args: --worker_pool) and set BEAM_ENVIRONMENT_TYPE=EXTERNAL
# BEAM_ENVIRONMENT_CONFIG=localhost:50000.
#
# Everything comes from the environment; a missing required setting stops the script with one
# line naming it, before anything runs. Typical use:
#   set -a; . infra/env/staging.env; set +a
#   MMLINKS_SOURCE=diy MMLINKS_INPUT=s3://bucket/raw/diy MMLINKS_OUTPUT=s3://bucket/datasets/diy \
#     infra/beam/flink.sh [extra `mmlinks data build` options]
#
# Required: MMLINKS_SOURCE, MMLINKS_INPUT, MMLINKS_OUTPUT, FLINK_MASTER (JobManager REST host:8081),
#           BEAM_WORKER_IMAGE (for DOCKER) or BEAM_ENVIRONMENT_CONFIG (for EXTERNAL/PROCESS)
# Optional: BEAM_ENVIRONMENT_TYPE (DOCKER | EXTERNAL | PROCESS), FLINK_VERSION (1.20),
#           FLINK_PARALLELISM (8), FLINK_JOB_SERVER_JAR (offline: a local job-server jar instead
#           of the Maven download), MMLINKS_DEVICE (cpu | cuda: GPUs on the TaskManagers),
#           MMLINKS_CLI (mmlinks), MMLINKS_DRY_RUN=1 (print, do not run)
# The submitting machine needs Java (the Beam job server) and mmlinks installed.
set -euo pipefail

: "${MMLINKS_SOURCE:?set MMLINKS_SOURCE to the dataset source (synthetic, diy, recipeqa, wiki, mscoco, story-dii, ...)}"
: "${MMLINKS_INPUT:?set MMLINKS_INPUT to the raw input URI (s3://... or gs://..., readable by the workers)}"
: "${MMLINKS_OUTPUT:?set MMLINKS_OUTPUT to the dataset output URI (s3://... or gs://...)}"
: "${FLINK_MASTER:?set FLINK_MASTER to the Flink JobManager REST address, host:8081 (see infra/env/<env>.env)}"

environment_type="${BEAM_ENVIRONMENT_TYPE:-DOCKER}"
case "$environment_type" in
  DOCKER)
    : "${BEAM_WORKER_IMAGE:?set BEAM_WORKER_IMAGE to the pushed worker image, REGISTRY/mmlinks/beam-worker:TAG (see infra/env/<env>.env)}"
    image_ref="${BEAM_WORKER_IMAGE##*/}"
    if [[ "$BEAM_WORKER_IMAGE" != *@sha256:* && ( "$image_ref" != *:* || "$image_ref" == *:latest ) ]]; then
      echo "flink.sh: BEAM_WORKER_IMAGE needs a pinned tag or digest, not none or 'latest': $BEAM_WORKER_IMAGE" >&2
      exit 2
    fi
    environment_config="$BEAM_WORKER_IMAGE"
    ;;
  EXTERNAL | PROCESS)
    : "${BEAM_ENVIRONMENT_CONFIG:?set BEAM_ENVIRONMENT_CONFIG for BEAM_ENVIRONMENT_TYPE=$environment_type (EXTERNAL: the worker pool address, e.g. localhost:50000)}"
    environment_config="$BEAM_ENVIRONMENT_CONFIG"
    ;;
  *)
    echo "flink.sh: BEAM_ENVIRONMENT_TYPE must be DOCKER, EXTERNAL or PROCESS, not $environment_type" >&2
    exit 2
    ;;
esac

beam_options=(
  "--flink_master=${FLINK_MASTER}"
  "--flink_version=${FLINK_VERSION:-1.20}"
  "--parallelism=${FLINK_PARALLELISM:-8}"
  "--environment_type=${environment_type}"
  "--environment_config=${environment_config}"
)
[[ -n "${FLINK_JOB_SERVER_JAR:-}" ]] && beam_options+=("--flink_job_server_jar=${FLINK_JOB_SERVER_JAR}")

cmd=(
  "${MMLINKS_CLI:-mmlinks}" data build
  --source "$MMLINKS_SOURCE"
  --input "$MMLINKS_INPUT"
  --out "$MMLINKS_OUTPUT"
  --device "${MMLINKS_DEVICE:-cpu}"
  "$@"
  --runner FlinkRunner
  --
  "${beam_options[@]}"
)

if [[ "${MMLINKS_DRY_RUN:-0}" == 1 ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
exec "${cmd[@]}"
