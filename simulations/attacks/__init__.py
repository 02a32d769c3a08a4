"""Attacks run as tests of fedveil's privacy: what an observer of an update can recover.

The harness computes the updates itself (fedveil never stores plain client updates), so
no attack here reads a run directory.
"""
