"""Privacy layer: secure aggregation, differential privacy, ledger. Pure logic, no transport."""
