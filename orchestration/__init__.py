"""Dagster Definitions, resources, partitions, jobs, schedules, sensors, and the CLI."""
