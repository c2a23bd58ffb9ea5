"""The `hulk-planner serve` process: the gRPC servicer and its domain (ingest, admission), the
SQLite store, the runtime with its periodic jobs, the fleet graph read from the store, publishing
placements over MQTT, the job lifecycle and re-planning the jobs of silent nodes (their
collaborators are the small protocols of ``seams``)."""
