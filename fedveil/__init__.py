"""fedveil: federated learning with secure aggregation and differential privacy."""

__version__ = "0.1.0"
