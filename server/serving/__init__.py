"""Serving what a federation trained: the prediction service and model exports."""
