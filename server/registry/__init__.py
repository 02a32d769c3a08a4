"""The model registry: each run's model as a named version, with its privacy model card."""
