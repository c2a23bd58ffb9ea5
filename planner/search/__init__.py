"""The Hulk planner (``--method search``): all jobs at once on disjoint node groups.

Pipeline of the planner, one module per step, every step judged by the reference cost model
(costmodel.estimate):

1. **Locality clusters** (:mod:`.clusters`). Nodes of the same city, or joined by links of at most
   ``CLUSTER_RTT_MS`` (the RTT up to which the TCP model still gives the full 10 Gbit/s), form a
   cluster (single linkage). Rings and chains that stay inside clusters are cheap; every WAN hop
   is expensive: a pipeline pays ``(M - 1) * max(x)`` with ``x`` including ``2 (a + A / bw)`` per
   hop, a data-parallel ring pays ``2 (D - 1) (a_max + S / (D bw_min))`` over its worst link.
2. **Heuristic class scores** (:mod:`.heuristics`, :func:`heuristic_scores`): nodes in locality
   order (component, clusters along an open path, fastest first) cut into contiguous segments,
   one per job, sized by the job's share of all FLOPs so that jobs finish together.
3. **Algorithm 1** (:mod:`.algorithm1`): feasible groups, merges and waiting phases.
4. **Per group** (:mod:`.groups`, :func:`best_placement`): which nodes (sets of clusters grown
   from the fastest or roomiest cluster by nearest neighbour; far clusters are left idle when
   they do not pay), K stages x D replicas, arrangement of the grid (:mod:`.arrangement`: stage
   groups of D similar nodes inside a cluster, stage groups ordered along an open path over
   clusters, bottleneck matching of replicas between consecutive stages, layer ranges balanced
   by throughput within memory, with a cap on the largest stage's all-reduce where that pays),
   micro-batch size from 1, 2, 4, 8 and the job's own; the best configurations' stage groups
   put in a better pipeline order (2-opt over the stage-to-stage transfer costs: the path over
   clusters can leave a slow WAN hop between consecutive stages that another order avoids,
   and the pipeline pays its largest hop M - 1 times); then a local search that drops stage
   groups / whole clusters when that makes the job faster.
5. **Across groups** (:mod:`.refine`, :func:`plan_search`): moves of free nodes and of cluster
   chunks (all, 1/2, 1/4, 1/8) from other jobs (the nearest ones and those with most slack,
   compensated with free nodes) or whole-group exchanges to the critical job, accepted when they
   lower the phase's makespan, then free nodes for the other jobs (sum of completion times);
   later-phase jobs are pulled into an earlier phase when free nodes allow it.
6. **Growing the bottleneck** (:mod:`.grow`): the job that sets the makespan is re-solved over a
   dense range of replica counts (stage groups per cluster and per city, trimmed to the fastest
   rows when extra rows only add hops, bubble and all-reduce) on its own nodes, plus the idle
   nodes of its clusters, plus those of the 1, 2 and 4 nearest clusters, or on a larger idle
   cluster; failing that, a job sharing its clusters moves to idle clusters and leaves it the
   nodes. Each step is kept only when the makespan drops.
7. **Chains of relocations** (:mod:`.chain`): the critical job moves into another job's place,
   that job into a third's (or the critical job's old one), and the third to what is left,
   possibly a share of the first place split with the critical job; judged at the NORMAL
   effort, the first place with a chain that shortens the makespan is taken, then steps 5-6 run
   again (at most three chains per phase).
8. **A portfolio of starts** (:mod:`.portfolio`, :func:`plan_portfolio`, ``--method portfolio``,
   the default of ``plan``): the refinement (steps 5-7) from several groupings: the heuristic
   one (the plain search, never stopped), groupings built job by job on the solver's best spots
   (:mod:`.starts`), Algorithm 1 on uniform, seeded random and a caller's (the GNN's) scores,
   the others refined in worker processes within a work budget (or a time budget), and the
   baselines' plans judged with them; the lowest makespan wins, so it is never worse than
   ``plan_search`` or a baseline.

**Islands** (:mod:`.islands`): a ``sync: diloco`` or ``sync: auto`` job (docs/COSTMODEL.md section
8) is answered, wherever steps 4-8 solve it on a pool of nodes, by the better of its synchronous
placement there and island layouts (pipelines in the pool's locality clusters with the most
compute, one outer group across them) with the inner steps H and compression its limits allow;
``sync: step`` jobs never go there, so their plans are unchanged.

:mod:`.state` holds what the steps 5 to 7 share: each job's current solution and the run's
context. The DT-FM-style peer (planner.baselines.dtfm) and the GNN (planner.gnn) reuse the
public parts of steps 1, 3 and 4.

Options are values (:mod:`.options`): :class:`SearchOptions` (rounds of moves, the wall-clock
safety cap, stage ordering and chains on or off) travels with each run down to the solver, and
the solver's effort is an :class:`Effort`. A run keeps its own tables of answers; nothing is
kept on the network.

Determinism: all choices depend only on the inputs and the options (ties broken by node index);
the search takes no seed. The amount of work is set by ``max_rounds`` and the efforts;
``budget_s`` is only a wall-clock safety cap. When the cap is hit the plan is still valid but
may differ between runs: ``plan.facts.cut_short`` says so (and a note, for people).
"""

from planner.search.clusters import CLUSTER_RTT_MS, cluster_labels, network_clusters
from planner.search.groups import best_placement
from planner.search.heuristics import heuristic_scores
from planner.search.options import Effort, EffortParams, SearchOptions
from planner.search.portfolio import plan_portfolio
from planner.search.refine import plan_search

__all__ = ["CLUSTER_RTT_MS", "Effort", "EffortParams", "SearchOptions", "best_placement",
           "cluster_labels", "heuristic_scores", "network_clusters", "plan_portfolio",
           "plan_search"]
