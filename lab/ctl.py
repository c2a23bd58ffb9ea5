"""Control a running ``python -m lab.run --keep`` lab from another shell.

    python -m lab.ctl status --work DIR            # each service: host, namespace, pid, alive
    python -m lab.ctl restart NAME --work DIR      # start a service again (agent-HOST, HOST,
                                                   # planner, mosquitto)

``restart`` stops the service if it still runs, then the lab starts it again exactly as it
started it first (same namespace, arguments and environment, log appended): the running lab
carries the request out, since the secure lab's secrets live only in its memory.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

from lab.netns import running
from lab.services import CONTROL_DIR, SERVICES_FILE

ANSWER_TIMEOUT_S = 30.0


class CtlError(Exception):
    pass


def read_services(work: Path) -> dict:
    path = work / SERVICES_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        raise CtlError(f"{path}: no lab's services file (is `python -m lab.run --work-dir "
                       f"{work}` running?)") from None


def status(work: Path) -> str:
    doc = read_services(work)
    lines = [f"lab.run pid {doc['lab_pid']} {'running' if running(doc['lab_pid']) else 'gone'}"]
    for row in doc["services"]:
        state = "running" if running(row["pid"]) else "dead"
        lines.append(f"{row['name']:24s} {row['host']:16s} {row['netns'] or '-':32s} "
                     f"pid {row['pid']:<8d} {state}  log {row['log']}")
    return "\n".join(lines)


def restart(work: Path, name: str, timeout_s: float = ANSWER_TIMEOUT_S) -> str:
    """Ask the running lab to start ``name`` again; its answer."""
    doc = read_services(work)
    if not running(doc["lab_pid"]):
        raise CtlError(f"the lab in {work} is not running (lab.run pid {doc['lab_pid']} is gone)")
    folder = work / CONTROL_DIR
    folder.mkdir(exist_ok=True)
    request = folder / f"{uuid.uuid4().hex}.request"
    tmp = request.with_suffix(".tmp")
    tmp.write_text(json.dumps({"restart": name}))
    tmp.replace(request)
    done = request.with_suffix(".done")
    deadline = time.monotonic() + timeout_s
    while not done.exists():
        if time.monotonic() > deadline:
            request.unlink(missing_ok=True)
            raise CtlError(f"no answer from the lab in {timeout_s:g} s: only a --keep lab "
                           "carries out requests, once it is up")
        time.sleep(0.2)
    answer = json.loads(done.read_text())
    done.unlink(missing_ok=True)
    if not answer.get("ok"):
        raise CtlError(answer.get("message", "refused"))
    return answer["message"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.ctl", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    st = sub.add_parser("status", help="each service of the lab and whether it runs")
    st.add_argument("--work", type=Path, required=True, help="the lab's --work-dir")
    rs = sub.add_parser("restart", help="start a service again (stopping it first if it runs)")
    rs.add_argument("name", help="agent-HOST (or just HOST), planner, mosquitto")
    rs.add_argument("--work", type=Path, required=True, help="the lab's --work-dir")
    args = p.parse_args(argv)
    try:
        print(status(args.work) if args.command == "status" else restart(args.work, args.name))
    except CtlError as err:
        print(f"lab.ctl: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
