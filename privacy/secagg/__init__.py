"""Secure aggregation: pairwise zero-sum masks with dropout recovery."""
