"""Models from a short spec; always an ``nn.Sequential`` of blocks so any strategy can cut it."""

from deepjimu.models.spec import build_model, count_blocks, factory_spec, parse_spec

__all__ = ["build_model", "count_blocks", "factory_spec", "parse_spec"]
