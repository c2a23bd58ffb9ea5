"""hulk-planner: the central planner. Folders by role: core (pure model), search, baselines, gnn,
files (file formats), service (the serve process), security, plots, commands (the CLI, the only
place that knows argparse)."""
