"""SimuMax import path: ``from simumax.core.graph import SimuONNXGraphBuilder, visualize_with_graphviz``."""

from simumax.compat.graph import OpGraph, SimuONNXGraphBuilder, visualize_with_graphviz

__all__ = ["OpGraph", "SimuONNXGraphBuilder", "visualize_with_graphviz"]
