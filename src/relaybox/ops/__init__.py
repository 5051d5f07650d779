"""Operator use cases, one layer shared by the admin API, the dashboard and the CLI.

:mod:`relaybox.ops.inbound` reads and acts on the receiving side (the inbox, dead
letters, quarantine, an event's history, replay, throughput); :mod:`relaybox.ops.outbound`
on the sending side (endpoints and their health, messages, deliveries, redelivery).
Their answers are the pydantic models of :mod:`relaybox.ops.inbound_models` and
:mod:`relaybox.ops.outbound_models`, which the admin API's OpenAPI document publishes
and ``relaybox … --json`` prints, so the three surfaces cannot drift apart. Errors
are :class:`relaybox.errors.OpsError` subclasses (``NotFound``, ``Conflict``,
``InvalidRequest``), each with its HTTP status and CLI exit code.
"""
