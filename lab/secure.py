"""The lab's secure mode (``python -m lab.run --secure``): the hub set up the way deploy/INSTALL.md
sets up a planner host, with the lab's folders in place of /etc/hulk and /etc/mosquitto/hulk.

- ``hulk-planner enroll --init-ca WORK/tls --host 10.77.0.1``: the private CA, the server
  certificate for the hub's address, the placement-signing key;
- the shipped ``deploy/mosquitto/hulk.conf`` with only its folder ``/etc/mosquitto/hulk``
  replaced by a folder of the lab's (TLS on 8883, loopback 1883, no anonymous clients, passwd and
  acl, ``use_username_as_clientid``), files owned by group mosquitto as INSTALL.md lays them out;
- ``enroll hulk-planner --role planner`` (the planner's broker account) and ``enroll NODE
  --signing-key ...`` per host (token, broker password, placement_key);
- an operator's broker account, ``hulk-operator``, for ``mosquitto_sub`` (deploy/INSTALL.md has
  none, and enroll makes only node and planner accounts): its password added with
  ``mosquitto_passwd`` and, after enroll's ACL, ``topic read hulk/v1/<fleet>/#``: it reads every
  topic of the fleet and publishes nothing. An ``enroll`` run while the lab is up rewrites the
  ACL from its own table, without this account;
- serve with ``--tls-cert/--tls-key`` and ``HULK_MQTT`` = the planner account on the hub's
  loopback; each agent with ``HULK_TOKEN``, ``--ca`` and ``HULK_MQTT`` =
  ``mqtts://NODE:PW@10.77.0.1:8883?ca=WORK/tls/ca.pem``; secrets travel in the environment, never
  on a command line.
"""

from __future__ import annotations

import grp
import json
import os
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from lab.netns import HUB_ADDRESS, LabError
from lab.wan import REPO

SHIPPED_BROKER_CONF = REPO / "deploy" / "mosquitto" / "hulk.conf"
SHIPPED_BROKER_DIR = "/etc/mosquitto/hulk"
TLS_PORT = 8883        # the shipped conf's agent listener (all addresses of the hub namespace)
LOCAL_PORT = 1883      # the shipped conf's loopback listener, for the planner
PLANNER_ACCOUNT = "hulk-planner"
OPERATOR_ACCOUNT = "hulk-operator"


@dataclass
class SecureHub:
    """What the secure lab made: paths, and the secrets enroll printed (kept in memory)."""

    tls: Path
    broker_dir: Path
    broker_conf: Path
    planner_mqtt: str                              # mqtt://hulk-planner:PW@127.0.0.1:1883
    placement_key: str = ""
    nodes: dict[str, dict] = field(default_factory=dict)   # node id -> enroll's JSON
    fleet: str = "default"
    operator_password: str = ""                    # OPERATOR_ACCOUNT's (add_operator)

    @property
    def ca(self) -> Path:
        return self.tls / "ca.pem"

    @property
    def signing_key(self) -> Path:
        return self.tls / "placement-signing.key"

    def serve_flags(self) -> list[str]:
        return ["--tls-cert", str(self.tls / "server.pem"), "--tls-key", str(self.tls / "server.key")]

    def planner_env(self) -> dict[str, str]:
        return {"HULK_MQTT": self.planner_mqtt, "HULK_SIGNING_KEY": str(self.signing_key)}

    def agent_env(self, node: str) -> dict[str, str]:
        enrolled = self.nodes[node]
        return {"HULK_TOKEN": enrolled["token"], "HULK_PLACEMENT_KEY": self.placement_key,
                "HULK_MQTT": agent_broker_url(node, enrolled["mqtt_password"], self.ca)}


def remove(hub: SecureHub | None) -> None:
    """Remove what :func:`prepare` made outside the work dir (the broker's folder)."""
    if hub is not None:
        shutil.rmtree(hub.broker_dir, ignore_errors=True)


def agent_broker_url(node: str, password: str, ca: Path) -> str:
    """The agent's broker URL as INSTALL.md writes it (enroll's passwords are URL-safe)."""
    return f"mqtts://{node}:{password}@{HUB_ADDRESS}:{TLS_PORT}?ca={ca}"


def broker_conf_text(broker_dir: Path) -> str:
    """The shipped broker configuration with its folder moved to ``broker_dir``, nothing else."""
    text = SHIPPED_BROKER_CONF.read_text()
    if SHIPPED_BROKER_DIR not in text or f"listener {TLS_PORT}\n" not in text:
        raise LabError(f"{SHIPPED_BROKER_CONF} no longer names {SHIPPED_BROKER_DIR} and listener "
                       f"{TLS_PORT}: update lab/secure.py")
    return text.replace(SHIPPED_BROKER_DIR, str(broker_dir))


def operator_acl(fleet: str) -> str:
    """The ACL lines of the operator's account: read every topic of ``fleet``, write none."""
    from hulk.wire.broker import check_name

    return (f"# the lab's operator account (lab/secure.py): reads the fleet's topics, writes none\n"
            f"user {OPERATOR_ACCOUNT}\ntopic read hulk/v1/{check_name(fleet, 'fleet')}/#\n")


def add_operator(broker_dir: Path, fleet: str, password: str) -> None:
    """``OPERATOR_ACCOUNT`` in the broker's passwd (``mosquitto_passwd -b``) and acl (its lines
    after enroll's, once), before mosquitto starts."""
    passwd, acl = broker_dir / "passwd", broker_dir / "acl"
    proc = subprocess.run(["mosquitto_passwd", "-b", str(passwd), OPERATOR_ACCOUNT, password],
                          capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise LabError(f"mosquitto_passwd: {(proc.stderr or proc.stdout).strip()[-300:]}")
    text = acl.read_text()
    if f"user {OPERATOR_ACCOUNT}\n" not in text:
        acl.write_text(text.rstrip("\n") + "\n\n" + operator_acl(fleet))


def _planner_cli(python: str, *args: str, env: dict[str, str]) -> dict:
    proc = subprocess.run([python, "-m", "planner.cli", *args, "--json"], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=120)
    if proc.returncode != 0:
        raise LabError(f"hulk-planner {' '.join(args)}: exit {proc.returncode}: "
                       f"{proc.stderr.strip()[-500:]}")
    return json.loads(proc.stdout)


def share_with_broker(broker_dir: Path) -> None:
    """INSTALL.md's layout: group mosquitto, setgid folders, files 0640 (mosquitto started as
    root drops to its own user and must still read them)."""
    try:
        gid = grp.getgrnam("mosquitto").gr_gid
    except KeyError:
        raise LabError("no group 'mosquitto': install Debian's mosquitto package") from None
    for path in [broker_dir, *broker_dir.rglob("*")]:
        os.chown(path, 0, gid)
        os.chmod(path, 0o2750 if path.is_dir() else 0o640)


def prepare(work: Path, db: Path, nodes: list[str], python: str, env: dict[str, str]) -> SecureHub:
    """CA, broker files and accounts, node enrolment: everything before the processes start."""
    tls = work / "tls"
    # mosquitto reads its files as user mosquitto after it starts, and a work dir under a private
    # parent (pytest's, mkdtemp's 0700) would lock it out: the broker's folder lives in /tmp.
    broker_dir = Path(tempfile.mkdtemp(prefix="hulk-lab-mosquitto-"))
    try:
        return _prepare(work, tls, broker_dir, db, nodes, python, env)
    except BaseException:
        shutil.rmtree(broker_dir, ignore_errors=True)
        raise


def _prepare(work: Path, tls: Path, broker_dir: Path, db: Path, nodes: list[str], python: str,
             env: dict[str, str]) -> SecureHub:
    (broker_dir / "tls").mkdir(parents=True, exist_ok=True)
    _planner_cli(python, "enroll", "--init-ca", str(tls), "--host", HUB_ADDRESS, env=env)
    for name in ("ca.pem", "server.pem", "server.key"):
        (broker_dir / "tls" / name).write_bytes((tls / name).read_bytes())
    accounts = ["--db", str(db), "--mqtt-passwd", str(broker_dir / "passwd"),
                "--mqtt-acl", str(broker_dir / "acl")]
    planner = _planner_cli(python, "enroll", PLANNER_ACCOUNT, "--role", "planner", *accounts,
                           env=env)
    hub = SecureHub(tls=tls, broker_dir=broker_dir, broker_conf=work / "mosquitto.conf",
                    planner_mqtt=f"mqtt://{PLANNER_ACCOUNT}:{planner['mqtt_password']}"
                                 f"@127.0.0.1:{LOCAL_PORT}")
    for node in nodes:
        hub.nodes[node] = _planner_cli(python, "enroll", node, *accounts, "--signing-key",
                                       str(hub.signing_key), env=env)
        hub.placement_key = hub.nodes[node]["placement_key"]
    hub.fleet = env.get("HULK_FLEET") or "default"
    hub.operator_password = secrets.token_urlsafe(24)
    add_operator(broker_dir, hub.fleet, hub.operator_password)
    share_with_broker(broker_dir)
    hub.broker_conf.write_text(broker_conf_text(broker_dir))
    return hub
