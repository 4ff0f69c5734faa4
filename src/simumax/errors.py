"""The one exception type for bad user input."""

from __future__ import annotations


class ConfigError(ValueError):
    """Bad or contradictory input.

    ``field`` names the offending config field (dotted for nested ones) and ``rule`` says
    what it must satisfy, so the CLI can print one line that tells the user what to fix.
    """

    def __init__(self, field: str, rule: str, source: str | None = None) -> None:
        self.field = field
        self.rule = rule
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field}: {rule}")
