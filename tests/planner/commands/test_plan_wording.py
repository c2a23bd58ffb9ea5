"""What `plan` prints about a placement says what its numbers are: stages, replicas,
nodes and cities, and per replica and step the micro-batch count and size that the placement
hands the training program (HULK_MICRO_BATCHES, HULK_MICRO_BATCH)."""

from __future__ import annotations

from rich.console import Console

from planner.commands.plan import MethodResult, print_plan
from planner.core.placements import build_node_placements
from planner.core.evaluate import evaluate
from tests.helpers.plans import manual_plan, two_city_net


def test_the_plan_names_micro_batch_count_and_size_as_the_placement_carries_them():
    net = two_city_net()
    plan = manual_plan(net)        # a: 2 x 2 on n0..n3, micro-batch 2 (gpt2-xl's own is 4)
    console = Console(record=True, width=240)
    print_plan(console, MethodResult("search", plan, evaluate(plan, net), 0.1), net)
    text = console.export_text()
    roles = build_node_placements(plan, net, fleet="lab", plan_id="p1")
    a, b = roles["n0"].roles[0], roles["n4"].roles[0]
    assert (a.micro_batches, a.micro_batch, b.micro_batches, b.micro_batch) == (128, 2, 32, 8)
    assert "2 stages x 2 replicas, 4 nodes in 2 cities: Beijing, Tokyo" in text
    assert ("each replica, each step: 128 micro-batches of 2 sequences (the job's micro_batch "
            "is 4; this plan uses 2)") in text
    assert "1 stage x 1 replica, 1 node in 1 city: Tokyo" in text
    assert "each replica, each step: 32 micro-batches of 8 sequences\n" in text
    assert "per replica)" not in text and "stage(s)" not in text
