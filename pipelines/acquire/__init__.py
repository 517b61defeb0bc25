"""Acquisition of PMC-OA articles: inventory, rate-limited transfers, safe packages, the raw layer."""
