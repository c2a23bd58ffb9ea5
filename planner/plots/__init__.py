"""Pictures: the fleet on a map-like layout, and a plan's compute/communication bars."""
