"""Who may talk to the planner and the broker: node tokens (credentials), the gRPC guard, TLS and
the private CA, broker accounts and ACLs."""
