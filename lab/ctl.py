"""Control a running ``python -m lab.run --keep`` lab from another shell.

    python -m lab.ctl status --work DIR            # each service: host, namespace, pid, alive
    python -m lab.ctl restart NAME --work DIR      # start a service again (agent-HOST, HOST,
                                                   # planner, mosquitto)
    python -m lab.ctl restart planner --work DIR [--drop NAME ...] -- --metrics 127.0.0.1:9108

``restart`` stops the service if it still runs, then the lab starts it again as it last ran it
(same namespace, arguments and environment, log appended): the running lab carries the request
out, since the secure lab's secrets live only in its memory. Flags after ``--`` are added to its
command line (one it has already is replaced) and ``--drop NAME`` removes ``--NAME`` with its
value; the service keeps the changed command line for later restarts (``status -v`` shows it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Sequence
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


def status(work: Path, verbose: bool = False) -> str:
    doc = read_services(work)
    lines = [f"lab.run pid {doc['lab_pid']} {'running' if running(doc['lab_pid']) else 'gone'}"]
    for row in doc["services"]:
        state = "running" if running(row["pid"]) else "dead"
        lines.append(f"{row['name']:24s} {row['host']:16s} {row['netns'] or '-':32s} "
                     f"pid {row['pid']:<8d} {state}  log {row['log']}")
        if verbose:
            lines.append(f"  {' '.join(row['argv'])}")
    return "\n".join(lines)


def restart_request(name: str, add: Sequence[str] = (), drop: Sequence[str] = ()) -> dict:
    """What ``restart`` asks of the running lab (lab.services.Services.serve_requests)."""
    if add and not add[0].startswith("-"):
        raise CtlError(f"expected flags to add after --, got {add[0]!r}")
    return {"restart": name, "add": list(add),
            "drop": [flag if flag.startswith("-") else f"--{flag}" for flag in drop]}


def restart(work: Path, name: str, timeout_s: float = ANSWER_TIMEOUT_S, *,
            add: Sequence[str] = (), drop: Sequence[str] = ()) -> str:
    """Ask the running lab to start ``name`` again (``add``, ``drop``: its command line's
    changes); its answer."""
    wanted = restart_request(name, add, drop)
    doc = read_services(work)
    if not running(doc["lab_pid"]):
        raise CtlError(f"the lab in {work} is not running (lab.run pid {doc['lab_pid']} is gone)")
    folder = work / CONTROL_DIR
    folder.mkdir(exist_ok=True)
    request = folder / f"{uuid.uuid4().hex}.request"
    tmp = request.with_suffix(".tmp")
    tmp.write_text(json.dumps(wanted))
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
    st.add_argument("-v", "--verbose", action="store_true", help="each service's command line too")
    rs = sub.add_parser("restart", help="start a service again (stopping it first if it runs)",
                        usage="python -m lab.ctl restart NAME --work DIR [--drop NAME] "
                              "[-- FLAG [VALUE] ...]")
    rs.add_argument("name", help="agent-HOST (or just HOST), planner, mosquitto")
    rs.add_argument("--work", type=Path, required=True, help="the lab's --work-dir")
    rs.add_argument("--drop", action="append", default=[], metavar="FLAG",
                    help="remove --FLAG (and its value) from the service's command line "
                         "(--drop metrics, or --drop=--metrics)")
    rs.epilog = ("after --: flags to add to the service's command line (each replaces the same "
                 "flag there), e.g. -- --dashboard 10.77.0.1:8443 --dashboard-token FILE")
    words = list(sys.argv[1:] if argv is None else argv)
    add = words[words.index("--") + 1:] if "--" in words else []
    args = p.parse_args(words[:words.index("--")] if "--" in words else words)
    if add and args.command != "restart":
        p.error("flags after -- are for restart")
    try:
        print(status(args.work, args.verbose) if args.command == "status"
              else restart(args.work, args.name, add=add, drop=args.drop))
    except CtlError as err:
        print(f"lab.ctl: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
