"""Typed results (SI units) and their human formatting."""
