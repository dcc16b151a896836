"""Data package: the Temporal-side configuration shipped with mcpsync (``*.toml``, see README.md).

A package (not a bare folder) so that ``importlib.resources.files("mcpsync.temporal")`` finds the
files the same way in a source checkout (editable install) and in an installed wheel.
"""
