"""Training recipes run as launched jobs (``python -m pipelines.training.<recipe> --config <url>``)."""
