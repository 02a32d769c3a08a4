"""Datasets in the core: the IDX reader, the built-in datasets, partitioners, writer styles.

The simulation partitions a dataset among its clients, the coordinator takes
only its test set, and a device reads its own files with the same IDX reader
and pixel statistics. Importing this package loads nothing heavy: import the
module you need (`fedveil.data.datasets`, `fedveil.data.idx`, ...).
"""
