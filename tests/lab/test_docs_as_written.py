"""deploy/INSTALL.md run as written (the docs had drifted from the programs).

The ``sh`` blocks of INSTALL.md run in order, each as one bash script (``set -euo pipefail``), on
two lab hosts: the **planner host** (the lab's hub namespace, 10.77.0.1, which the lab's
``/etc/hosts`` calls ``planner.example.org``) for sections 1, 2 and the enrolment of section 3,
and the **GPU server** ``tokyo-2`` (the node INSTALL.md and deploy/agent.yaml name, so agent.yaml
needs no edit) for the agent's block. Each host has its own private mount namespace (``unshare
--mount``) with overlays on /etc, /opt, /usr/local and /var and a tmpfs on /run, so everything the
guide installs (users, units, keys, /opt/hulk, symlinks) vanishes with the test and this
machine is not changed. Commands run from a folder holding ``deploy/`` (the repository's) as the
guide assumes; on the GPU server it also holds ``ca.pem``, copied from the planner host as the
guide's comment says.

`systemctl` is a shim, TEST SCAFFOLDING (tests/lab/systemctl_shim.py): systemd is not PID 1 here.
It starts, restarts and reloads the installed units' ExecStart=/ExecReload= with their
User=, EnvironmentFile= and LoadCredential=, without systemd's sandboxing.

The only changes to the text are those in SUBSTITUTIONS and NOT_RUN below, each with why. Then
the test checks the outcome: serve answers over TLS and runs with the broker account written
after its first start; planner.env and agent.env are root's 0600 and agent.yaml holds no secret;
the agent registered with its token over TLS and subscribed with its own mqtts account; a
placement pushed with the planner's account and signing key reaches the agent, which accepts it
under the pinned placement_key. Then "Revoking a node" runs as written: the broker refuses the
node's account, and the agent, restarted, ends with exit 2 and one line. The README's real-fleet
example (a summary with serve in the foreground, not run) is checked against the result: the
files it names exist, its broker account exists, every mqtts URL carries ?ca=.

Not covered: the broker's nftables rules are checked as loaded (in the hub's own network
namespace), not exercised with 257 connections; mosquitto's fd-limit drop-in and systemd's
hardening of the units are not applied (tests/deploy run `systemd-analyze verify` on the units);
the agent runs without CAP_NET_RAW (one agent: nothing to probe); the jobs venv with torch and a
job actually running; optional mutual TLS. The enrolment's "copy ca.pem to the GPU server" is
done by the test.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab import matrix as lab_matrix
from lab.netns import HUB_ADDRESS
from lab.wan import HUB, WanLab
from tests.helpers.paths import REPO
from tests.helpers.waits import wait_until


INSTALL = REPO / "deploy" / "INSTALL.md"
README = REPO / "README.md"
NODE = "tokyo-2"                       # the guide's example node (deploy/agent.yaml: node_id)
PLANNER_NAME = "planner.example.org"   # the guide's planner host: the hub, via the lab's /etc/hosts
SHIM = Path(__file__).with_name("systemctl_shim.py")
OVERLAID = ("etc", "opt", "usr/local", "var")

# (pattern on one line, replacement, why). Placeholders <...> are filled from what earlier
# commands printed (enroll's "key: value" lines), see fill_placeholders.
SUBSTITUTIONS: list[tuple[str, str, str]] = [
    (r"^python3 -m venv /opt/hulk( && /opt/hulk/bin/pip install .*)?$", "make_hulk_venv",
     "no network for pip here: /opt/hulk/bin/hulk-planner and hulk-agent become two-line "
     "wrappers that run this checkout with the test's interpreter (same entry points)"),
    (r"^/opt/hulk/bin/pip install .*$", ": pip install left out, see make_hulk_venv",
     "as above: the packages are the test venv's"),
    (r"^apt-get install -y (.*)$", r"check_installed \1",
     "no network: the packages must already be installed on this machine (checked with dpkg)"),
    (r"\bsudo -u (\S+) ", r"runuser -u \1 -- ",
     "sudo is not installed on the test machine; runuser is root's `sudo -u`"),
]
PLACEHOLDERS = {
    "<password>": ("hulk-planner", "mqtt_password", "the planner account's password enroll printed"),
    "hulk1.<id>.<secret>": (NODE, "token", "the token enroll printed for the node"),
    "<broker password>": (NODE, "mqtt_password", "the node's broker password enroll printed"),
    "ed25519:<key>": (NODE, "placement_key", "the placement_key enroll printed"),
}
# Blocks not run: a substring of the block or its section -> why.
NOT_RUN = {
    "/opt/hulk-jobs": "the jobs' venv with torch (pip, no network); no job runs in this test",
    "Client certificates": "optional mutual TLS (tests/agent/test_client_tls.py covers the agent's side)",
    "The fleet dashboard (optional)": "optional; journalctl has no shim here. The dashboard behind "
                                      "serve with TLS and a token is tested in tests/planner/dashboard "
                                      "(real serve, headless Chromium)",
    "Rotating the placement-signing key": "it edits both hosts' files in turn; "
                                          "tests/planner/service/test_key_rotation_e2e.py runs its "
                                          "steps (real serve, broker, agent, a job running across)",
    "Metrics (Prometheus)": "optional; needs Debian's prometheus, which the project does not install. "
                            "tests/planner/service/test_metrics_scrape.py (real serve and agents) and "
                            "tests/deploy/test_monitoring_files.py cover the endpoints and shipped files",
}
# Sections run after the checks (they undo what the checks need), in their order in the guide.
RUN_LAST = ("Revoking a node",)


@dataclass
class Block:
    section: str
    line: int
    text: str


def sh_blocks(markdown: str) -> list[Block]:
    """The fenced ```sh blocks of ``markdown`` with the heading they are under."""
    blocks, section, inside, start, lines = [], "", False, 0, []
    for number, line in enumerate(markdown.splitlines(), 1):
        if not inside and line.startswith("#"):
            section = line.lstrip("#").strip()
        elif not inside and line.strip() == "```sh":
            inside, start, lines = True, number + 1, []
        elif inside and line.strip() == "```":
            inside = False
            blocks.append(Block(section, start, "\n".join(lines)))
        elif inside:
            lines.append(line)
    assert not inside, "an unclosed ```sh block"
    return blocks


def not_run(block: Block) -> str | None:
    return next((why for key, why in NOT_RUN.items() if key in block.text or key in block.section),
                None)


def runs_on_gpu_server(block: Block) -> bool:
    """Section 3's block that installs the agent; its enrolment runs on the planner host."""
    return block.section.startswith("3.") and "hulk-agent" in block.text


def substitute(text: str) -> str:
    out = []
    for line in text.splitlines():
        for pattern, replacement, _ in SUBSTITUTIONS:
            line = re.sub(pattern, replacement, line)
        out.append(line)
    return "\n".join(out)


def printed_values(output: str) -> dict[str, str]:
    """enroll's ``key: value`` lines."""
    return dict(re.findall(r"^(\w+): (\S+)$", output, re.M))


def fill_placeholders(text: str, accounts: dict[str, dict[str, str]], where: str) -> str:
    for placeholder, (account, key, _) in PLACEHOLDERS.items():
        if placeholder in text:
            assert key in accounts.get(account, {}), \
                f"{where} uses {placeholder} before any command printed {account}'s {key}"
            text = text.replace(placeholder, accounts[account][key])
    left = re.findall(r"<[a-z][a-z _-]*>", text)
    assert not left, f"{where}: placeholders no earlier command printed: {left}"
    return text


class Host:
    """A lab namespace with a private mount namespace (overlays) held by a sleeping process."""

    def __init__(self, lab: WanLab, host: str, scratch: Path):
        self.lab, self.host, self.scratch = lab, host, scratch
        self.state = scratch / "systemctl"      # the shim's pids and logs (outside the overlays)
        self.cwd = scratch / "cwd"
        for folder in (self.state, self.cwd, scratch / "bin"):
            folder.mkdir(parents=True)
        (self.cwd / "deploy").symlink_to(REPO / "deploy")
        (scratch / "bin" / "systemctl").write_text(f"#!/bin/sh\nexec {sys.executable} {SHIM} \"$@\"\n")
        (scratch / "bin" / "systemctl").chmod(0o755)
        setup = "\n".join(
            [f"mkdir -p {scratch}/upper/{d} {scratch}/work/{d} && mount -t overlay overlay -o "
             f"lowerdir=/{d},upperdir={scratch}/upper/{d},workdir={scratch}/work/{d} /{d}"
             for d in OVERLAID]
            # The test's interpreter may live under /root (0700): the guide's service users must
            # run it, so in here /root is 0711 (an overlay whose top folder has that mode).
            + [f"mkdir -p {scratch}/upper/root {scratch}/work/root && chmod 0711 {scratch}/upper/root"
               f" && mount -t overlay overlay -o lowerdir=/root,upperdir={scratch}/upper/root,"
               f"workdir={scratch}/work/root /root"]
            # /run: a tmpfs, with the lab's network namespaces carried over onto it.
            + [f"mkdir -p {scratch}/netns && mount --rbind /run/netns {scratch}/netns",
               "mount -t tmpfs -o mode=0755 tmpfs /run && mkdir /run/netns",
               f"mount --move {scratch}/netns /run/netns", f"touch {scratch}/ready",
               # Held while the test runs; ends by itself if pytest is killed.
               f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done"])
        self.holder = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "bash",
                                        "-euc", setup], start_new_session=True)
        deadline = time.monotonic() + 20
        while not (scratch / "ready").exists():
            assert self.holder.poll() is None and time.monotonic() < deadline, "mount setup failed"
            time.sleep(0.1)

    def path(self, path: str) -> Path:
        """``path`` as this host sees it."""
        return Path(f"/proc/{self.holder.pid}/root{path}")

    def bash(self, script: str, timeout: float = 180) -> subprocess.CompletedProcess:
        preamble = textwrap.dedent(f"""\
            set -euo pipefail
            export PATH={self.scratch}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
            export HULK_SHIM_STATE={self.state}
            make_hulk_venv() {{
                mkdir -p /opt/hulk/bin
                printf '#!/bin/sh\\nPYTHONPATH={REPO} exec {sys.executable} -m planner.cli "$@"\\n' > /opt/hulk/bin/hulk-planner
                printf '#!/bin/sh\\nPYTHONPATH={REPO} exec {sys.executable} -m agent "$@"\\n' > /opt/hulk/bin/hulk-agent
                chmod 0755 /opt/hulk/bin/hulk-planner /opt/hulk/bin/hulk-agent
            }}
            check_installed() {{ for p in "$@"; do dpkg -s "$p" >/dev/null; done; }}
            cd {self.cwd}
            set -x
            """)
        argv = ["nsenter", "-t", str(self.holder.pid), "-m", "--",
                *self.lab.exec_argv(self.host, ["bash", "-c", preamble + script])]
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)

    def log(self, unit: str) -> str:
        path = self.state / f"{unit}.service.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        for pid_file in self.state.glob("*.pid"):
            if pid_file.with_suffix(".exit").exists():   # ended already: the pid may be reused
                continue
            try:
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        os.killpg(self.holder.pid, signal.SIGKILL)
        self.holder.wait(10)


# Each poll reads a log inside a lab host: every half second is often enough.
wait_for = functools.partial(wait_until, interval=0.5)


@pytest.fixture
def hosts(lab_available, tmp_path):
    for tool in ("mosquitto", "unshare", "nsenter", "runuser", "nft"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    lab = WanLab(lab_matrix.from_cities(["Tokyo"], names=[NODE]), work_dir=tmp_path / "lab").start()
    made: list[Host] = []
    try:
        for host in (HUB, NODE):   # the guide's planner name resolves to the hub
            with open(f"/etc/netns/{lab.ns(host).netns}/hosts", "a") as hosts_file:
                hosts_file.write(f"{HUB_ADDRESS} {PLANNER_NAME}\n")
        made.append(Host(lab, HUB, tmp_path / "planner-host"))
        made.append(Host(lab, NODE, tmp_path / "gpu-server"))
        yield made[0], made[1]
    finally:
        for host in made:
            host.stop()
        lab.stop()


def run_install_md(planner: Host, gpu: Host, markdown: str, accounts: dict[str, dict[str, str]],
                   *, last: bool = False) -> dict[str, dict[str, str]]:
    """Every ``sh`` block in order (``last``: only the RUN_LAST sections, else all others);
    ``accounts`` collects enroll's printed values by account."""
    blocks = sh_blocks(markdown)
    assert len(blocks) >= 6, "INSTALL.md lost its command blocks?"
    for block in blocks:
        where = f"INSTALL.md line {block.line} ({block.section})"
        if not_run(block) or (block.section in RUN_LAST) != last:
            continue
        host = gpu if runs_on_gpu_server(block) else planner
        if host is gpu and not (gpu.cwd / "ca.pem").exists():   # "copied from the planner host"
            shutil.copyfile(planner.path("/etc/hulk/tls/ca.pem"), gpu.cwd / "ca.pem")
        script = fill_placeholders(substitute(block.text), accounts, where)
        done = host.bash(script)
        assert done.returncode == 0, (f"{where} failed on {host.host} (exit {done.returncode}):\n"
                                      f"{done.stderr[-3000:]}\n{done.stdout[-1000:]}\n"
                                      f"planner: {planner.log('hulk-planner')[-1500:]}")
        values = printed_values(done.stdout)
        name = values.get("mqtt_username") or values.get("node_id")
        if name:
            accounts[name] = values
    return accounts


@pytest.mark.root
@pytest.mark.process
@pytest.mark.slow
def test_install_md_as_written_gives_a_fleet_that_works_over_tls(hosts, tmp_path):
    planner, gpu = hosts
    accounts = run_install_md(planner, gpu, INSTALL.read_text(), {})
    assert {"hulk-planner", NODE} <= set(accounts), accounts.keys()

    # Secrets: only in root's 0600 files that systemd reads, never in agent.yaml.
    for host, env_file in ((planner, "/etc/hulk/planner.env"), (gpu, "/etc/hulk/agent.env")):
        info = host.path(env_file).stat()
        assert (info.st_mode & 0o777, info.st_uid) == (0o600, 0), f"{env_file}: {oct(info.st_mode)}"
    agent_yaml = gpu.path("/etc/hulk/agent.yaml").read_text()
    assert accounts[NODE]["mqtt_password"] not in agent_yaml and accounts[NODE]["token"] not in agent_yaml

    # serve: started by step 1, restarted with the broker account (step 2), still up.
    serve_log = planner.log("hulk-planner")
    last_start = serve_log.rsplit("--- start", 1)[-1]
    assert "--tls-cert /etc/hulk/tls/server.pem" in last_start and "--insecure" not in last_start
    assert "listening on 0.0.0.0:50051 (TLS)" in last_start, last_start[-2000:]
    # The broker's connection limit, loaded into the hub's own network namespace.
    rules = planner.bash("nft list table inet hulk_broker")
    assert rules.returncode == 0 and "ct count over 256" in rules.stdout, rules.stderr[-1000:]
    wait_for(lambda: "recovery: nodes silent" in planner.log("hulk-planner").rsplit("--- start", 1)[-1],
             30, "serve to run with HULK_MQTT from planner.env (re-planning and pushes on)",
             detail=lambda: planner.log("hulk-planner")[-3000:])

    # The agent: registered over TLS with its token, subscribed with its own mqtts account.
    wait_for(lambda: f"registered {NODE}" in planner.log("hulk-planner"), 60,
             "the agent to register", detail=lambda: gpu.log("hulk-agent")[-3000:])
    wait_for(lambda: f"subscribed to hulk/v1/default/nodes/{NODE}/placement" in gpu.log("hulk-agent"),
             60, "the agent to subscribe", detail=lambda: gpu.log("hulk-agent")[-3000:])
    broker_log = planner.path("/var/log/mosquitto/mosquitto.log").read_text()
    agent_address = re.escape(planner.lab.address(NODE))
    assert re.search(rf"New connection from {agent_address}:\d+ on port 8883", broker_log), broker_log
    assert re.search(rf"New client connected from {agent_address}:\d+ as {NODE} \(.*u'{NODE}'\)",
                     broker_log), broker_log[-3000:]
    assert "Traceback" not in gpu.log("hulk-agent")

    # An operator pushes a plan with the planner's account and key; the agent accepts it.
    shared = Path(tempfile.mkdtemp(prefix="hulk-docs-test-"))
    try:
        shared.chmod(0o755)
        exported = planner.bash(
            "runuser -u hulk-planner -- hulk-planner fleet export "
            "--db /var/lib/hulk-planner/planner.sqlite --out /var/lib/hulk-planner/fleet.json")
        assert exported.returncode == 0, exported.stderr[-2000:]
        fleet = json.loads(planner.path("/var/lib/hulk-planner/fleet.json").read_text())
        fleet["nodes"] = [dict(n, gpus=8, gpu_name="NVIDIA A100-SXM4-40GB", memory_gb=320.0)
                          for n in fleet["nodes"] if n["id"] == NODE]
        (shared / "fleet.json").write_text(json.dumps(fleet))
        (shared / "jobs.yaml").write_text("jobs:\n  - name: bert\n    model: bert-large\n")
        for path in shared.iterdir():
            path.chmod(0o644)
        pushed = planner.bash(
            "set -a; . /etc/hulk/planner.env; set +a\n"
            f"runuser -u hulk-planner -- env HULK_MQTT=\"$HULK_MQTT\" HULK_SIGNING_KEY=\"$HULK_SIGNING_KEY\" "
            f"hulk-planner plan {shared}/jobs.yaml --fleet {shared}/fleet.json --no-compare "
            f"--out /var/lib/hulk-planner/plan.json --push")
        assert pushed.returncode == 0 and "pushed to 1 node" in pushed.stdout, \
            pushed.stdout[-2000:] + pushed.stderr[-2000:]
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    placement_file = gpu.path("/var/lib/hulk-agent/placement.json")
    wait_for(placement_file.exists, 30, "the placement on the GPU server",
             detail=lambda: gpu.log("hulk-agent")[-3000:])
    placement = json.loads(placement_file.read_text())
    assert placement["node"] == NODE and [r["job"] for r in placement["roles"]] == ["bert"]

    check_readme_example(planner, gpu, accounts)

    # The node's broker account works from a plain client too (the retained placement) ...
    password = accounts[NODE]["mqtt_password"]
    subscribe = (f"mosquitto_sub -h {PLANNER_NAME} -p 8883 --cafile /etc/hulk/tls/ca.pem -u {NODE} "
                 f"-P {password} -t hulk/v1/default/nodes/{NODE}/placement -C 1 -W 5")
    before = gpu.bash(subscribe)
    assert before.returncode == 0 and '"node":' in before.stdout, before.stderr[-1000:]
    # ... until "Revoking a node": then the broker refuses it, and the planner its token: the
    # agent, restarted, ends with exit 2 and its one line.
    run_install_md(planner, gpu, INSTALL.read_text(), accounts, last=True)
    after = gpu.bash(subscribe)
    assert after.returncode != 0 and "not authori" in (after.stdout + after.stderr).lower(), \
        after.stdout[-500:] + after.stderr[-500:]
    gpu.bash("systemctl restart hulk-agent")   # may return before the refusal
    wait_for(lambda: gpu.bash("systemctl is-active hulk-agent").returncode != 0, 60,
             "the revoked agent to end", detail=lambda: gpu.log("hulk-agent")[-2000:])
    last_line = gpu.log("hulk-agent").strip().splitlines()[-1]
    assert last_line.startswith("hulk-agent: the planner refuses this node's credentials"), last_line
    assert (gpu.state / "hulk-agent.service.exit").read_text().strip() == "2"


def readme_fleet_block() -> str:
    (block,) = [b.text for b in sh_blocks(README.read_text()) if b.section == "Running a real fleet"]
    return block


def check_readme_example(planner: Host, gpu: Host, accounts: dict) -> None:
    """The README's short version names the guide's files and accounts."""
    block = readme_fleet_block()
    agent_part = block[block.index("# each GPU server"):]
    for path in sorted(set(re.findall(r"(/(?:etc|var/lib)/[\w./-]+\w)", block))):
        host = gpu if path in agent_part and path not in block[:block.index("# each GPU server")] \
            else planner
        assert host.path(path).exists(), f"README.md's real-fleet example names {path}, which " \
                                         f"INSTALL.md does not make on the {host.host} host"
    for user in re.findall(r"mqtts?://([\w-]+):", block):
        assert user in set(accounts), f"README.md's broker URL uses account {user!r}, which enroll " \
                                 f"did not create (made: {sorted(accounts)})"
    docs = (block + INSTALL.read_text()).replace("<broker password>", "PW")
    for url in re.findall(r"mqtts://[^\s`'\"]*@[^\s`'\"]+", docs):   # the URLs with a host
        assert "?ca=" in url, f"an mqtts URL without ?ca= (the fleet CA is private): {url}"


# ------------------------------------------------------------- the parser and substitutions alone

def test_the_parser_finds_the_guides_blocks_and_each_skip_and_placeholder_is_used():
    """A NOT_RUN entry or placeholder the guide no longer has would hide drift: all must match."""
    text = INSTALL.read_text()
    blocks = sh_blocks(text)
    for key in NOT_RUN:
        assert any(key in b.text or key in b.section for b in blocks), f"NOT_RUN {key!r} matches nothing"
    run_text = "\n".join(b.text for b in blocks if not not_run(b))
    for placeholder in PLACEHOLDERS:
        assert placeholder in run_text, f"placeholder {placeholder!r} is no longer in INSTALL.md"
    for pattern, _, _ in SUBSTITUTIONS:
        assert any(re.search(pattern, line) for line in run_text.splitlines()), pattern
    assert [b.section[:2] for b in blocks if runs_on_gpu_server(b)] == ["3."]
    assert "hulk-planner" in readme_fleet_block()
