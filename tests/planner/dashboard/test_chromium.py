"""The dashboard in a real browser: `hulk-planner serve --dashboard` with a registered fleet and a
running job, opened by headless Chromium (Debian's `chromium`, installed by `make install`) with
the operator token; the DOM after the page's JavaScript ran and a screenshot are checked."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest

from hulk.v1 import hulk_pb2_grpc
from hulk.wire.records import GpuInfo, Inventory, NodeLocation, RegisterRequest
from planner.core.fleet import Fleet, Link, Node
from planner.core.jobs import catalog_job
from planner.core.placements import job_spec
from planner.service.store import Store
from tests.helpers.paths import REPO
from tests.helpers.ports import free_port
from tests.helpers.processes import start_planner
from tests.helpers.waits import wait_until

pytestmark = [pytest.mark.process, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TOKEN = "dashboard-test-token-0123456789"
A100 = GpuInfo("NVIDIA A100-SXM4-40GB", "", 8.0, 40 * 10**9)
CITIES = {"bj-1": "Beijing", "bj-2": "Beijing", "tk-1": "Tokyo", "ld-1": "London"}
RTT_MS = {("bj-1", "bj-2"): 2.0, ("bj-1", "tk-1"): 40.0, ("bj-2", "tk-1"): 44.0,
          ("bj-1", "ld-1"): 200.0, ("bj-2", "ld-1"): 204.0, ("tk-1", "ld-1"): 250.0}
ALIVE_RGB, SILENT_RGB = (0x25, 0x63, 0xEB), (0x9C, 0xA3, 0xAF)   # app.js STATE_COLOURS
JOB = "gpt-demo"


def prepare_store(db: Path) -> None:
    """The fleet's GPUs and links as an imported fleet file gives them; ld-1 registered two
    minutes ago and silent since; a job running on the Beijing nodes, as the lifecycle records it."""
    nodes = tuple(Node(n, city=c, gpus=8, gpu_name=A100.name, compute_capability=8.0, memory_gb=320.0)
                  for n, c in CITIES.items())
    links = tuple(Link(a, b, rtt_ms=rtt, samples=10) for (a, b), rtt in RTT_MS.items())
    with Store(db) as store:
        store.import_fleet(Fleet(nodes, links))
        job = store.submit_job(JOB, job_spec(catalog_job("gpt2-xl", JOB)))
        store.update_job(job.id, state="running", plan_id="plan-test", nodes=["bj-1", "bj-2"],
                         estimate_s=5400.0)
    with Store(db, clock=lambda: int(time.time() * 1000) - 120_000) as store:
        store.register(register("ld-1"))


def register(node_id: str) -> RegisterRequest:
    return RegisterRequest(node_id, hostname=f"host-{node_id}", agent_version="test",
                           location=NodeLocation(city=CITIES[node_id]),
                           inventory=Inventory(gpus=(A100,) * 8), address="127.0.0.1")


def api(port: int, name: str) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/{name}",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def chromium(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
               "--no-first-run", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", f"--user-data-dir={profile}", "--window-size=1280,800",
               "--virtual-time-budget=5000", *args, url]
    return subprocess.run(command, capture_output=True, text=True, timeout=90)


def hex_rgb(colour: str) -> tuple[int, int, int]:
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (`make install` installs "
                                              "Debian's chromium package)")
def test_the_dashboard_renders_the_fleet_jobs_and_plan_in_headless_chromium(tmp_path):
    from PIL import Image

    db = tmp_path / "planner.sqlite"
    prepare_store(db)
    token = tmp_path / "dashboard.token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    port = free_port()
    planner = start_planner(db, extra=("--dashboard", f"127.0.0.1:{port}", "--dashboard-token",
                                       str(token), "--node-timeout", "30"))
    try:
        with grpc.insecure_channel(planner.address) as channel:
            stub = hulk_pb2_grpc.PlannerStub(channel)
            for node in ("bj-1", "bj-2", "tk-1"):
                stub.Register(register(node).to_proto(), timeout=10)
        wait_until(lambda: api(port, "fleet")["totals"]["alive"] == 3, 20, "three nodes alive",
                   detail=planner.output)
        wait_until(lambda: api(port, "plan")["status"] == "ready", 60, "the methods compared",
                   detail=lambda: api(port, "plan"))
        fleet = api(port, "fleet")
        assert fleet["totals"]["silent"] == 1
        site_links = {(l["a"], l["b"]): l for l in fleet["links"]}
        assert set(site_links) == {("Beijing", "Tokyo"), ("Beijing", "London"), ("London", "Tokyo")}
        assert site_links[("Beijing", "Tokyo")]["rtt_ms"] == 42.0

        url = f"http://operator:{TOKEN}@127.0.0.1:{port}/"
        dom = chromium(url, tmp_path / "profile-dom", "--dump-dom")
        assert dom.returncode == 0, dom.stderr[-2000:]
        html = dom.stdout
        assert 'data-loaded="1"' in html and "cannot refresh" not in html, html[-3000:]
        for node in CITIES:
            assert f'<tr data-node="{node}">' in html, node
        assert f'<tr data-job="{JOB}">' in html and "bj-1, bj-2" in html
        assert 'data-method="portfolio"' in html and 'data-method="system-b"' in html
        for link in site_links.values():
            assert f'stroke="{link["colour"]}"' in html, link

        shot = tmp_path / "dashboard.png"
        run = chromium(url, tmp_path / "profile-shot", f"--screenshot={shot}")
        assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
        image = Image.open(shot).convert("RGB")
        assert image.size == (1280, 800)
        colours = {rgb for _, rgb in image.getcolors(maxcolors=1 << 20)}
        assert len(colours) > 50, f"a nearly blank page: {len(colours)} colours"
        for link in site_links.values():
            assert hex_rgb(link["colour"]) in colours, f"link {link['a']}-{link['b']} not drawn"
        assert ALIVE_RGB in colours and SILENT_RGB in colours, "node state dots not drawn"

        refused = chromium(f"http://127.0.0.1:{port}/", tmp_path / "profile-anon", "--dump-dom")
        # Headless Chromium cannot answer the login prompt: the load fails (or shows the 401 body).
        assert "data-loaded" not in refused.stdout
        assert ("ERR_INVALID_AUTH_CREDENTIALS" in refused.stderr
                or "authentication required" in refused.stdout), refused.stderr[-2000:]
    finally:
        planner.stop()


def install_guide_chromium_block() -> str:
    """The sh block of deploy/INSTALL.md that screenshots the dashboard with headless Chromium."""
    text = (REPO / "deploy" / "INSTALL.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    found = [b for b in blocks if "chromium --headless" in b]
    assert len(found) == 1, "deploy/INSTALL.md: expected one chromium block"
    return found[0]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (`make install` installs "
                                              "Debian's chromium package)")
def test_the_install_guides_chromium_command_works_on_a_tls_dashboard(tmp_path):
    """The guide's command as written (root, serve's own certificate from `enroll --init-ca`,
    127.0.0.1) only with its paths and port moved into the test's folder."""
    import ssl

    from planner.security.tls import init_pki

    db = tmp_path / "planner.sqlite"
    prepare_store(db)
    token = tmp_path / "dashboard.token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    pki = init_pki(tmp_path / "tls", ["planner.example.org"])
    port = free_port()
    planner = start_planner(db, extra=("--tls-cert", str(pki["server_cert"]), "--tls-key",
                                       str(pki["server_key"]), "--dashboard", f"127.0.0.1:{port}",
                                       "--dashboard-token", str(token)))
    try:
        # The certificate covers 127.0.0.1 although --host named only the public name.
        context = ssl.create_default_context(cafile=str(pki["ca"]))
        request = urllib.request.Request(f"https://127.0.0.1:{port}/api/fleet",
                                         headers={"Authorization": f"Bearer {TOKEN}"})

        def gpus() -> int | None:
            try:
                with urllib.request.urlopen(request, timeout=10, context=context) as response:
                    return json.load(response)["totals"]["gpus"]
            except urllib.error.HTTPError as exc:   # 503 until the first documents are built
                assert exc.code == 503, exc
                return None
        wait_until(lambda: gpus() == 32, 20, "the dashboard over verified TLS",
                   detail=planner.output)

        shot = tmp_path / "dashboard.png"
        script = (install_guide_chromium_block()
                  .replace("/etc/hulk/tls/server.pem", str(pki["server_cert"]))
                  .replace("/etc/hulk/dashboard.token", str(token))
                  .replace("/tmp/dashboard.png", str(shot)).replace(":8443/", f":{port}/"))
        run = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True,
                             text=True, timeout=120, cwd=tmp_path)
        assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
        from PIL import Image
        image = Image.open(shot).convert("RGB")
        colours = {rgb for _, rgb in image.getcolors(maxcolors=1 << 20)}
        assert len(colours) > 50, f"an error page, not the dashboard: {len(colours)} colours"
        assert ALIVE_RGB in colours or SILENT_RGB in colours, "node state dots not drawn"
    finally:
        planner.stop()
