"""Tables and charts of project04's benchmarks, rendered from their JSON records alone."""

from .render import render, targets

__all__ = ["render", "targets"]
