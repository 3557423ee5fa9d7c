#!/usr/bin/env bash
# Build an mmlinks dataset with Apache Beam on Google Cloud Dataflow, with GPU workers for the
# feature extraction (one NVIDIA T4 per worker, driver installed by Dataflow) and the mmlinks
# worker image (infra/docker/beam-worker.Dockerfile) as the SDK container.
#
# Everything comes from the environment; a missing required setting stops the script with one
# line naming it, before anything runs. Typical use:
#   set -a; . infra/env/staging.env; set +a
#   MMLINKS_SOURCE=diy MMLINKS_INPUT=gs://bucket/raw/diy MMLINKS_OUTPUT=gs://bucket/datasets/diy \
#     infra/beam/dataflow.sh [extra `mmlinks data build` options, e.g. --image-store gs://bucket/images]
#
# Required: MMLINKS_SOURCE, MMLINKS_INPUT, MMLINKS_OUTPUT, GCP_PROJECT, GCP_REGION,
#           DATAFLOW_TEMP_LOCATION (gs://), BEAM_WORKER_IMAGE (pushed worker image)
# Optional: DATAFLOW_STAGING_LOCATION (gs://), DATAFLOW_MACHINE_TYPE (n1-standard-4; T4s need N1),
#           DATAFLOW_MAX_WORKERS (8), DATAFLOW_GPU_TYPE (nvidia-tesla-t4; "none" = CPU workers),
#           DATAFLOW_GPU_COUNT (1), DATAFLOW_JOB_NAME, DATAFLOW_SERVICE_ACCOUNT,
#           DATAFLOW_SUBNETWORK, MMLINKS_DEVICE (cuda with GPUs, else cpu), MMLINKS_CLI (mmlinks),
#           MMLINKS_DRY_RUN=1 (print the command, do not run it)
# The launching machine needs mmlinks installed with apache-beam[gcp]==2.77.0 and Google Cloud
# credentials (gcloud auth application-default login, or a service account).
set -euo pipefail

: "${MMLINKS_SOURCE:?set MMLINKS_SOURCE to the dataset source (synthetic, diy, recipeqa, wiki, mscoco, story-dii, ...)}"
: "${MMLINKS_INPUT:?set MMLINKS_INPUT to the raw input URI (gs://...)}"
: "${MMLINKS_OUTPUT:?set MMLINKS_OUTPUT to the dataset output URI (gs://...)}"
: "${GCP_PROJECT:?set GCP_PROJECT to the Google Cloud project id (see infra/env/<env>.env)}"
: "${GCP_REGION:?set GCP_REGION to the Dataflow region, e.g. us-central1 (see infra/env/<env>.env)}"
: "${DATAFLOW_TEMP_LOCATION:?set DATAFLOW_TEMP_LOCATION to a gs:// folder for temporary files (see infra/env/<env>.env)}"
: "${BEAM_WORKER_IMAGE:?set BEAM_WORKER_IMAGE to the pushed worker image, REGISTRY/mmlinks/beam-worker:TAG (see infra/env/<env>.env)}"

case "$DATAFLOW_TEMP_LOCATION" in
  gs://*) ;;
  *) echo "dataflow.sh: DATAFLOW_TEMP_LOCATION must be a gs:// folder, not $DATAFLOW_TEMP_LOCATION" >&2; exit 2 ;;
esac
image_ref="${BEAM_WORKER_IMAGE##*/}"
if [[ "$BEAM_WORKER_IMAGE" != *@sha256:* && ( "$image_ref" != *:* || "$image_ref" == *:latest ) ]]; then
  echo "dataflow.sh: BEAM_WORKER_IMAGE needs a pinned tag or digest, not none or 'latest': $BEAM_WORKER_IMAGE" >&2
  exit 2
fi

machine_type="${DATAFLOW_MACHINE_TYPE:-n1-standard-4}"
gpu_type="${DATAFLOW_GPU_TYPE:-nvidia-tesla-t4}"
gpu_count="${DATAFLOW_GPU_COUNT:-1}"

beam_options=(
  "--project=${GCP_PROJECT}"
  "--region=${GCP_REGION}"
  "--temp_location=${DATAFLOW_TEMP_LOCATION}"
  "--sdk_container_image=${BEAM_WORKER_IMAGE}"
  "--experiments=use_runner_v2"
  "--machine_type=${machine_type}"
  "--max_num_workers=${DATAFLOW_MAX_WORKERS:-8}"
)
[[ -n "${DATAFLOW_STAGING_LOCATION:-}" ]] && beam_options+=("--staging_location=${DATAFLOW_STAGING_LOCATION}")
[[ -n "${DATAFLOW_JOB_NAME:-}" ]] && beam_options+=("--job_name=${DATAFLOW_JOB_NAME}")
[[ -n "${DATAFLOW_SERVICE_ACCOUNT:-}" ]] && beam_options+=("--service_account_email=${DATAFLOW_SERVICE_ACCOUNT}")
[[ -n "${DATAFLOW_SUBNETWORK:-}" ]] && beam_options+=("--subnetwork=${DATAFLOW_SUBNETWORK}")

device=cpu
if [[ "$gpu_type" != none ]]; then
  # GPU workers for feature extraction (quoted as one argument: ';' separates the service options).
  beam_options+=("--dataflow_service_options=worker_accelerator=type:${gpu_type};count:${gpu_count};install-nvidia-driver")
  device=cuda
fi
device="${MMLINKS_DEVICE:-$device}"

cmd=(
  "${MMLINKS_CLI:-mmlinks}" data build
  --source "$MMLINKS_SOURCE"
  --input "$MMLINKS_INPUT"
  --out "$MMLINKS_OUTPUT"
  --device "$device"
  "$@"
  --runner DataflowRunner
  --
  "${beam_options[@]}"
)

if [[ "${MMLINKS_DRY_RUN:-0}" == 1 ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
exec "${cmd[@]}"
