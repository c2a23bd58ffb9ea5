"""The Hulk GNN (torch-geometric): edge pooling, GCN layers, node-job pair scores (jobs as a set).

Import cost matters for the CLI, so this package's ``__init__`` imports nothing heavy; use
``planner.gnn.starts.plan_with_gnn_start`` for planning (the portfolio with the GNN's start
added), ``planner.gnn.infer.plan_gnn`` for the benchmarks' diagnostics and ``planner.gnn.train``
for training.
"""


def plan_gnn(*args, **kwargs):
    """Lazy alias of :func:`planner.gnn.infer.plan_gnn`."""
    from planner.gnn.infer import plan_gnn as _plan_gnn

    return _plan_gnn(*args, **kwargs)
