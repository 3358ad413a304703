"""mtl-decoder: multi-task text models on a Pre-LN decoder trunk with a PLE expert/gate block in every layer."""

__version__ = "0.1.0"
