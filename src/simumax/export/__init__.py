"""Exports of configs to other tools' formats."""
