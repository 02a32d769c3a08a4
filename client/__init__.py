"""Client side: local training and the client half of the round pipeline."""
