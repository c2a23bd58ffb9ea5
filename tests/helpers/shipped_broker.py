"""The shipped mosquitto configuration (deploy/mosquitto/hulk.conf) run for real with test paths
and ports, accounts made by `hulk-planner enroll`, and a paho client over TLS that records what
it receives."""

from __future__ import annotations

import grp
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import paho.mqtt.client as paho

from planner import cli
from planner.security.tls import init_pki
from tests.helpers.broker import start_mosquitto
from tests.helpers.paths import REPO
from tests.helpers.ports import free_port
from tests.helpers.processes import stop_process

SHIPPED = REPO / "deploy" / "mosquitto" / "hulk.conf"


class ShippedBroker:
    """The shipped config with /etc/mosquitto/hulk -> a temp dir and test ports; files laid out as
    INSTALL.md says (group mosquitto, setgid dir, keys 0640) so the broker reads them after it
    drops to the mosquitto user."""

    def __init__(self, *, shipped_ports: bool = False):
        """``shipped_ports``: keep 8883 and 1883 (for a broker in a network namespace of its own)."""
        self.dir = Path(tempfile.mkdtemp(prefix="hulk-mq-"))
        self.tls_port, self.local_port = (8883, 1883) if shipped_ports else (free_port(), free_port())
        self.db = self.dir / "planner.sqlite"
        pki = init_pki(self.dir / "tls", ["127.0.0.1", "localhost"])
        self.ca = pki["ca"]
        text = SHIPPED.read_text()
        assert "listener 8883\n" in text and "listener 1883 127.0.0.1\n" in text
        text = text.replace("/etc/mosquitto/hulk", str(self.dir))
        if not shipped_ports:
            text = (text.replace("listener 8883\n", f"listener {self.tls_port} 127.0.0.1\n")
                    .replace("listener 1883 127.0.0.1\n", f"listener {self.local_port} 127.0.0.1\n"))
        self.conf = self.dir / "mosquitto.conf"
        self.conf.write_text(text + f"\nlog_dest file {self.dir}/mosquitto.log\nlog_type all\n")
        self.proc: subprocess.Popen | None = None

    def enroll(self, *args: str) -> dict[str, str]:
        import contextlib
        import io
        import json
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cli.main(["enroll", *args, "--db", str(self.db), "--mqtt-passwd",
                             str(self.dir / "passwd"), "--mqtt-acl", str(self.dir / "acl"),
                             "--json"]) == 0
        self._share_with_broker()
        return json.loads(out.getvalue())

    def revoke(self, node: str) -> None:
        assert cli.main(["revoke", node, "--db", str(self.db), "--mqtt-passwd",
                         str(self.dir / "passwd"), "--mqtt-acl", str(self.dir / "acl")]) == 0
        self._share_with_broker()

    def _share_with_broker(self) -> None:
        if os.geteuid() != 0:
            return
        gid = grp.getgrnam("mosquitto").gr_gid
        for path in [self.dir, *self.dir.rglob("*")]:
            os.chown(path, 0, gid)
            os.chmod(path, 0o2750 if path.is_dir() else 0o640)

    def start(self) -> None:
        self.proc = start_mosquitto(self.conf, self.tls_port)

    def reload(self) -> None:
        self.proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)

    def stop(self) -> None:
        if self.proc:
            stop_process(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


class Client:
    """A paho client over TLS that records what it receives."""

    def __init__(self, broker: ShippedBroker, username: str | None, password: str | None, *,
                 tls: bool = True, client_id: str | None = None):
        self.received: list[tuple[str, bytes]] = []
        self.connected = threading.Event()
        self.disconnects = 0
        self.reason = None
        self.c = paho.Client(paho.CallbackAPIVersion.VERSION2,
                             client_id=client_id or f"t-{username}-{time.time_ns()}")
        if username:
            self.c.username_pw_set(username, password)
        if tls:
            self.c.tls_set(ca_certs=str(broker.ca), tls_version=ssl.PROTOCOL_TLS_CLIENT)
        self.c.on_connect = self._on_connect
        self.c.on_disconnect = lambda *args: setattr(self, "disconnects", self.disconnects + 1)
        self.c.on_message = lambda c, u, m: self.received.append((m.topic, m.payload))
        self.port = broker.tls_port

    def _on_connect(self, client, userdata, flags, reason, properties):
        self.reason = reason
        self.connected.set()

    def connect(self) -> bool:
        try:
            self.c.connect("127.0.0.1", self.port, keepalive=30)
        except (OSError, ssl.SSLError):
            return False
        self.c.loop_start()
        self.connected.wait(3)
        return self.reason is not None and not self.reason.is_failure

    def subscribe(self, topic: str) -> None:
        done = threading.Event()
        self.c.on_subscribe = lambda *a: done.set()
        self.c.subscribe(topic, qos=1)
        assert done.wait(5)

    def publish(self, topic: str, payload: bytes, retain: bool = True) -> None:
        self.c.publish(topic, payload, qos=1, retain=retain).wait_for_publish(5)

    def close(self) -> None:
        self.c.loop_stop()
        self.c.disconnect()
