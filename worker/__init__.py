"""Processes, in rooms: cli/, ingress/, serve/, stack/, main/, observe/, api/.

A room's ``__init__`` names (``__all__``) the modules other rooms may import; tests/unit/test_layers.py
keeps every import across rooms to those.
"""
