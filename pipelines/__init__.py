"""Stage logic of PanelForge as plain Python (no Dagster), usable in tests, Ray workers and notebooks."""
