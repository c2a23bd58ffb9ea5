"""File formats users hand the planner and get back: fleets (fleet JSON, the paper's folder or
zip), jobs.yaml and plan JSON. Every reader answers bad input with one InputError line naming the
file, the line and the field."""
