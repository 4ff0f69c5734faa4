"""Costs: kernel time from the system config (compute roofline, memory-bound, collectives)."""
