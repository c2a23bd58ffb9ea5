"""The pure core of the planner: values in, values out; no SQLite, gRPC or MQTT inside."""
