"""Strategy search: enumerate legal strategies, evaluate memory first, cost what fits."""
