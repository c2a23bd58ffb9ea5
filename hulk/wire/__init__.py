"""The contract between hulk-agent and hulk-planner: every record that crosses the wire.

- ``hulk.wire.records``: the gRPC messages (protos/hulk/v1/hulk.proto) as immutable records that
  convert themselves to and from protobuf (``record.to_proto()``, ``Record.from_proto(msg)``).
- ``hulk.wire.throughput``: the throughput tests' slots (planner to agents, in heartbeats) and
  results (receiving agent to planner, in reports), checked when read from the wire.
- ``hulk.wire.placement``: the MQTT placement message (``hulk-placement/2``) and the retained plan
  summary (``hulk-plan-summary/2``), with their strict parsers.
- ``hulk.wire.signing``: the Ed25519 signatures both messages carry.
- ``hulk.wire.broker``: broker URLs and topic names.

Both sides import from here and nothing else defines these records. Nothing here imports the
planner, numpy or torch (the agent depends on it).
"""
