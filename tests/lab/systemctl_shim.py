"""TEST SCAFFOLDING, not a systemd: the `systemctl` that tests/lab/test_docs_as_written.py puts
first on PATH, because systemd is not PID 1 where the tests run. It does what the install guide
needs from systemd, from the installed unit files, and nothing more:

- ``start``/``enable --now``/``restart UNIT``: runs the unit's ExecStartPre= lines, then its
  ExecStart= in a session of its own (Type=oneshot: to completion), with Environment= and
  EnvironmentFile= (``-`` optional), LoadCredential= (copied into
  ``/run/credentials/UNIT/``, ``$CREDENTIALS_DIRECTORY`` set), User=/Group= (DynamicUser=yes: a
  fixed unused uid), StateDirectory= made and owned by that user, ``${VAR}`` expanded; a main
  process that exits within 2 s fails the call, as a failed start does. ``restart`` stops a
  running one first (SIGTERM, then SIGKILL).
- ``reload UNIT``: runs ExecReload= with ``$MAINPID``; a unit without one fails, as in systemd.
- ``stop UNIT``; ``is-active UNIT`` (exit 3 when not running); ``daemon-reload`` and plain
  ``enable`` do nothing.

Units are read from /etc/systemd/system, then /lib/systemd/system, with drop-ins from
``/etc/systemd/system/UNIT.d/*.conf``. Hardening (ProtectSystem=, capabilities, seccomp,
watchdog, notify) is NOT applied. Each main process has a small supervisor (a fork of the shim)
that records its exit code: ``$HULK_SHIM_STATE/UNIT.pid|exit|log``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

UNIT_DIRS = [Path("/etc/systemd/system"), Path("/lib/systemd/system")]
DYNAMIC_UID = 61999     # DynamicUser=yes: an id no account on the test machine has
STATE = Path(os.environ.get("HULK_SHIM_STATE", "/run/hulk-systemctl-shim"))
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def unit_name(name: str) -> str:
    return name if "." in name else f"{name}.service"


def read_unit(name: str) -> dict[str, list[str]]:
    """Service-section keys -> values in order (unit file, then drop-ins)."""
    files = [d / name for d in UNIT_DIRS if (d / name).is_file()][:1]
    if not files:
        fail(f"Unit {name} not found.", 5)
    files += sorted((UNIT_DIRS[0] / f"{name}.d").glob("*.conf"))
    keys: dict[str, list[str]] = {}
    for path in files:
        text = re.sub(r"\\\n\s*", " ", path.read_text())
        section = ""
        for line in text.splitlines():
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = line
            elif section == "[Service]" and "=" in line:
                key, value = line.split("=", 1)
                keys.setdefault(key.strip(), []).append(value.strip())
    return keys


def fail(message: str, code: int = 1) -> None:
    print(message, file=sys.stderr)
    raise SystemExit(code)


def environment(unit: str, keys: dict[str, list[str]]) -> dict[str, str]:
    env = {"PATH": BASE_PATH, "LANG": "C.UTF-8"}
    for spec in keys.get("Environment", []):
        for item in shlex.split(spec):
            k, _, v = item.partition("=")
            env[k] = v
    for spec in keys.get("EnvironmentFile", []):
        optional, path = spec.startswith("-"), Path(spec.lstrip("-"))
        if not path.exists():
            if optional:
                continue
            fail(f"{unit}: EnvironmentFile {path} is missing")
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, _, v = line.partition("=")
                env[k.strip()] = v.strip().strip("'\"")
    return env


def expand(command: str, env: dict[str, str]) -> list[str]:
    command = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), command)
    return shlex.split(command.lstrip("-@+!:"))


def identity(keys: dict[str, list[str]]) -> tuple[int | None, int | None]:
    import grp
    import pwd

    if keys.get("DynamicUser", ["no"])[-1] == "yes":
        return DYNAMIC_UID, DYNAMIC_UID
    user = keys.get("User", [None])[-1]
    group = keys.get("Group", [None])[-1]
    uid = pwd.getpwnam(user).pw_uid if user else None
    gid = grp.getgrnam(group).gr_gid if group else (pwd.getpwnam(user).pw_gid if user else None)
    return uid, gid


def prepare(unit: str, keys: dict[str, list[str]], env: dict[str, str]) -> tuple[int | None, int | None]:
    uid, gid = identity(keys)
    for spec in keys.get("StateDirectory", []):
        for name in spec.split():
            path = Path("/var/lib") / name
            path.mkdir(parents=True, exist_ok=True)
            os.chown(path, uid if uid is not None else 0, gid if gid is not None else 0)
            os.chmod(path, int(keys.get("StateDirectoryMode", ["0755"])[-1], 8))
    credentials = keys.get("LoadCredential", [])
    if credentials:
        folder = Path("/run/credentials") / unit
        folder.mkdir(parents=True, exist_ok=True)
        for spec in credentials:
            name, _, source = spec.partition(":")
            shutil.copyfile(source, folder / name)
            os.chown(folder / name, uid if uid is not None else 0, gid if gid is not None else 0)
            os.chmod(folder / name, 0o400)
        os.chown(folder, uid if uid is not None else 0, gid if gid is not None else 0)
        os.chmod(folder, 0o500)
        env["CREDENTIALS_DIRECTORY"] = str(folder)
    return uid, gid


def main_pid(unit: str) -> int | None:
    """The running main process (None once its supervisor recorded an exit code)."""
    try:
        pid = int((STATE / f"{unit}.pid").read_text())
    except (OSError, ValueError):
        return None
    return None if (STATE / f"{unit}.exit").exists() else pid


def stop(unit: str) -> None:
    pid = main_pid(unit)
    if pid is None:
        return
    os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not (STATE / f"{unit}.exit").exists():
        time.sleep(0.1)
    if not (STATE / f"{unit}.exit").exists():
        os.killpg(pid, signal.SIGKILL)
    (STATE / f"{unit}.pid").unlink(missing_ok=True)


def start(unit: str) -> None:
    if main_pid(unit) is not None:
        return
    keys = read_unit(unit)
    env = environment(unit, keys)
    uid, gid = prepare(unit, keys, env)
    for line in keys.get("ExecStartPre", []):
        if subprocess.run(expand(line, env), env=env).returncode != 0 and not line.startswith("-"):
            fail(f"Job for {unit} failed: ExecStartPre {line}")
    STATE.mkdir(parents=True, exist_ok=True)
    log = open(STATE / f"{unit}.log", "ab")
    argv = expand(keys["ExecStart"][-1], env)
    if keys.get("Type", ["simple"])[-1] == "oneshot":
        code = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT, user=uid,
                              group=gid, extra_groups=[] if uid is not None else None).returncode
        if code != 0:
            fail(f"Job for {unit} failed: {argv[0]} exited with {code} (see {STATE / unit}.log)")
        return
    log.write(f"--- start {' '.join(argv)}\n".encode())
    log.flush()
    (STATE / f"{unit}.exit").unlink(missing_ok=True)
    (STATE / f"{unit}.pid").unlink(missing_ok=True)
    if os.fork() == 0:   # the supervisor: starts the main process, records its exit code
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):   # let go of the caller's pipes
            os.dup2(null, fd)
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, user=uid,
                                group=gid, extra_groups=[] if uid is not None else None)
        (STATE / f"{unit}.pid").write_text(str(proc.pid))
        code = proc.wait()
        (STATE / f"{unit}.exit").write_text(f"{code}\n")
        os._exit(0)
    time.sleep(2)
    if (STATE / f"{unit}.exit").exists():
        code = (STATE / f"{unit}.exit").read_text().strip()
        fail(f"Job for {unit} failed: exit {code} (see {STATE / unit}.log)")


def reload(unit: str) -> None:
    keys = read_unit(unit)
    pid = main_pid(unit)
    if "ExecReload" not in keys:
        fail(f"Failed to reload {unit}: Job type reload is not applicable for unit {unit}.")
    if pid is None:
        fail(f"Failed to reload {unit}: Unit {unit} is not active.")
    env = dict(environment(unit, keys), MAINPID=str(pid))
    for line in keys["ExecReload"]:
        if subprocess.run(expand(line, env), env=env).returncode != 0:
            fail(f"Failed to reload {unit}")


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("-")]
    now = "--now" in argv
    if not args:
        fail("systemctl shim: expected a verb")
    verb, units = args[0], [unit_name(u) for u in args[1:]]
    with open(STATE / "calls.log", "a") if STATE.is_dir() else open(os.devnull, "w") as calls:
        calls.write(" ".join(argv) + "\n")
    if verb == "daemon-reload" or (verb == "enable" and not now):
        return 0
    for unit in units:
        if verb in ("start",) or (verb == "enable" and now):
            start(unit)
        elif verb == "restart":
            stop(unit)
            start(unit)
        elif verb == "reload":
            reload(unit)
        elif verb == "stop":
            stop(unit)
        elif verb == "is-active":
            active = main_pid(unit) is not None
            print("active" if active else "inactive")
            if not active:
                return 3
        else:
            fail(f"systemctl shim: {verb} is not supported (test scaffolding)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
