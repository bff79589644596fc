"""Costs: bytes and FLOPs per node (one registry), expert traffic, hardware rooflines, the analysis.

Third stage: reads graphs and memory plans, never builds reports."""
