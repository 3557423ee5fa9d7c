"""Deployment configuration (container images, cluster manifests); see infra/README.md."""
