"""Data sets: the registry of upstream files and loaders of their formats."""
