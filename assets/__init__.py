"""Thin Dagster assets, one module per lineage stage."""
