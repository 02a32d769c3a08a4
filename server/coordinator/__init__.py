"""The coordinator as a long-running service: SuperLink, Fleet gateway, HTTP API, runs."""
