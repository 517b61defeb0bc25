"""Dagster resources for every external system, and loopback stand-ins for tests and the demo."""
