"""Differential privacy: clipping, mechanisms, accountants, budget, ledger, reports."""
