"""Datasets, partitioners, in-process engine, Flower simulation runner."""
