"""The shipped monitoring files (deploy/prometheus/, deploy/grafana/) use only metrics the code
exports: every ``hulk_*`` name in an alert expression or a dashboard query is checked against
what the planner's and the agent's registries actually expose. With Debian's ``promtool``
installed, the rules and the scrape example are also checked by Prometheus's own tool, and the
alert rules are run against made-up series (tests/deploy/data/hulk-alerts-test.yml)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from agent.metrics import AgentMetrics
from planner.service.metrics import PlannerMetrics, fleet_snapshot
from tests.helpers.paths import REPO

ALERTS = REPO / "deploy/prometheus/hulk-alerts.yml"
SCRAPE = REPO / "deploy/prometheus/prometheus.yml"
DASHBOARD = REPO / "deploy/grafana/hulk-dashboard.json"
ALERT_TESTS = Path(__file__).parent / "data/hulk-alerts-test.yml"
NAME = re.compile(r"\bhulk_[a-z0-9_]+")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",),
            "info": ("_info",)}


def sample_names(registry) -> set[str]:
    """Every sample name a registry exposes, children or not (families come from collect())."""
    names = set()
    for family in registry.collect():
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> set[str]:
    planner = PlannerMetrics()
    planner.watch_fleet(lambda: fleet_snapshot([], [], [], now_ms=0, node_timeout_s=30))

    class Runtime:   # what the agent's scrape reads
        class spool:
            depth = held = dropped = 0
            max_samples = 100
        registration = None

    agent = AgentMetrics("n1")
    agent.watch(Runtime())
    return sample_names(planner.registry) | sample_names(agent.registry)


def test_the_registries_export_the_metrics_the_issue_asks_for(exported):
    for name in ("hulk_samples_received_total", "hulk_samples_rejected_total",
                 "hulk_reports_total", "hulk_registrations_total", "hulk_node_clock_skew_seconds",
                 "hulk_link_rtt_seconds", "hulk_jobs", "hulk_replans_total",
                 "hulk_placement_pushes_total", "hulk_nodes", "hulk_plan_makespan_seconds",
                 "hulk_agent_probes_total", "hulk_agent_probe_losses_total",
                 "hulk_agent_rtt_seconds_bucket", "hulk_agent_spool_depth_samples",
                 "hulk_agent_spool_dropped_samples_total", "hulk_agent_reports_total",
                 "hulk_agent_report_failures_total", "hulk_agent_clock_skew_seconds",
                 "hulk_agent_placement_refusals_total", "hulk_agent_launches_total",
                 "hulk_agent_job_exits_total"):
        assert name in exported, name
    assert all(n.startswith("hulk_") for n in exported)


def test_alert_rules_parse_and_use_only_exported_metrics(exported):
    doc = yaml.safe_load(ALERTS.read_text())
    groups = {g["name"]: g["rules"] for g in doc["groups"]}
    assert set(groups) == {"hulk-fleet", "hulk-measurements", "hulk-jobs"}
    rules = {r["alert"]: r for rules in groups.values() for r in rules}
    for wanted in ("HulkNodeSilent", "HulkSpoolDropping", "HulkAgentSpoolDropping",
                   "HulkJobFailed", "HulkClockSkew", "HulkPlacementRefused"):
        assert wanted in rules, wanted
    for name, rule in rules.items():
        used = set(NAME.findall(rule["expr"]))
        assert used, f"{name}: its expression names no hulk_ metric"
        assert used <= exported, f"{name}: {sorted(used - exported)} are not exported"
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), name
        assert rule["annotations"]["summary"], name


def test_the_scrape_example_scrapes_planner_and_agents_and_loads_the_rules():
    doc = yaml.safe_load(SCRAPE.read_text())
    assert {j["job_name"] for j in doc["scrape_configs"]} == {"hulk-planner", "hulk-agent"}
    assert all((SCRAPE.parent / f).is_file() for f in doc["rule_files"])


def test_the_dashboard_uses_only_exported_metrics(exported):
    dashboard = json.loads(DASHBOARD.read_text())
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Fleet overview", "RTT", "Spool", "Jobs"]
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    used = {n for e in exprs for n in NAME.findall(e)}
    assert used <= exported, sorted(used - exported)
    assert all(NAME.search(e) for e in exprs)
    # Imports into any Grafana: the data source is chosen at import time.
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
    assert all(p["datasource"]["uid"] == "${DS_PROMETHEUS}" for p in dashboard["panels"]
               if p["type"] != "row")
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


PROMTOOL = shutil.which("promtool")


@pytest.mark.process
@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package prometheus)")
def test_promtool_accepts_the_rules_and_the_scrape_example_and_the_alerts_fire():
    for args in (["check", "rules", str(ALERTS)], ["check", "config", str(SCRAPE)],
                 ["test", "rules", ALERT_TESTS.name]):
        done = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60,
                              cwd=ALERT_TESTS.parent)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
