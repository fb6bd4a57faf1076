"""Customers are a dynamic partition set: adding a customer file never needs code."""

import dagster as dg

customers_partitions = dg.DynamicPartitionsDefinition(name="customers")
