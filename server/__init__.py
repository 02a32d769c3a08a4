"""Coordinator: round engine, strategies, run store, service, Flower ServerApp adapter."""
