"""mcpsync: a durable reconciler that makes MCP resource content provably fresh.

Contract: the one installable namespace. Its subpackages come from the repository's top-level
folders (pyproject ``[tool.setuptools.package-dir]``): ``mcpsync.workflows`` <- ``workflows/``,
``mcpsync.activities`` <- ``activities/``, ``mcpsync.worker`` <- ``worker/``, ``mcpsync.temporal``
<- ``temporal/`` (package data only). Importing this package imports nothing else: the workflow
sandbox re-imports it for every workflow run. ``__version__`` is the project's version, defined
here once (pyproject reads it).
"""

__version__ = "0.2.0"
