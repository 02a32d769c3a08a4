"""Gossip training: one model per client, mixed with its neighbours' over a graph.

- topology.py: the graphs (ring, torus, exponential, random-regular), Metropolis-Hastings
  weights, the spectral gap
- mixing.py: one mixing step over the stacked (clients x d) models
- engine.py: the rounds (train every client, mix, record), on the in-process transport
- run.py: `fedveil simulate --aggregation gossip`: the run directory
- privacy.py: what a gossip run's privacy report may say
- distributed.py: the same rounds as processes exchanging models over torch.distributed
"""
