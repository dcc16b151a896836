"""The records and messages mcpsync exchanges: one pydantic model a concept, one module a concern.

Contract:
- Every model is a ``base.FrozenRecord`` (frozen, no unknown field, never a body or a credential),
  serializable through ``temporalio.contrib.pydantic.pydantic_data_converter``; workflows, activities,
  the ledger and the CLI all speak these types and nothing else. A versioned name
  (``resourceSubscription.v1`` ...) is stable: a change that breaks readers gets a new version.
- One module per concern: ``base`` (``FrozenRecord``), ``subscription`` (identity, options, states,
  the messages into the workflow), ``mcp_calls`` (subscribe, unsubscribe, read), ``ledger`` (the
  fence row, allocation, acceptance), ``read_cycle`` (the one-round-trip cycles, the ingress's
  report), ``versioned`` (``resourceVersion.v1``, ``resourceSubscription.v1``), ``catalog``.
  Importers name the module that defines a model; a model's module does not enter its JSON.
"""
