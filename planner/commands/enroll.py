"""`hulk-planner enroll` and `hulk-planner revoke`: a node's credentials, issued and ended.

    hulk-planner enroll NODE_ID --db PATH [--mqtt-passwd FILE --mqtt-acl FILE] [--json]
    hulk-planner enroll planner --role planner --db PATH --mqtt-passwd FILE --mqtt-acl FILE
    hulk-planner enroll --init-ca DIR --host planner.example.org [--host 203.0.113.7 ...]
    hulk-planner enroll NODE_ID --db PATH --signing-key DIR/placement-signing.key   (prints placement_key)
    hulk-planner enroll --new-signing-key DIR    (a replacement placement-signing key beside DIR's)
    hulk-planner revoke NODE_ID --db PATH [--mqtt-passwd FILE --mqtt-acl FILE]

A node gets a gRPC token bound to its id (stored hashed) and, with the broker files, a broker
account that may only read its own placement topic. Secrets are printed once. ``--init-ca`` also
makes the Ed25519 placement-signing key (DIR/placement-signing.key, 0600, and .pub); with
``--signing-key`` (HULK_SIGNING_KEY) ``enroll NODE`` prints ``placement_key``, the public key the
agent pins (its ``placement_key`` setting). ``--new-signing-key DIR`` makes a replacement key
(DIR/placement-signing.key.new and .pub.new; the key in use is kept) and prints its public key:
deploy/INSTALL.md, "Rotating the placement-signing key", says how agents and serve take it up.
After changing the broker files reload mosquitto (``systemctl reload mosquitto``; it rereads them on SIGHUP).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hulk.errors import ConfigError, InputError, NotFoundError
from planner.security.credentials import CredentialStore, check_node_id
from planner.security.broker_accounts import BrokerAccounts, placement_topic
from planner.service.database import refuse_foreign_file
from planner.settings import PlannerSettings


def register(sub: argparse._SubParsersAction, settings: PlannerSettings) -> None:
    enroll = sub.add_parser("enroll", help="issue a node's gRPC token and broker account",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    enroll.add_argument("node_id", nargs="?", metavar="NODE_ID")
    _common(enroll, settings)
    enroll.add_argument("--role", choices=["node", "planner"], default="node",
                        help="'planner': the planner's own broker account (may write hulk/v1/#), "
                             "no gRPC token")
    enroll.add_argument("--init-ca", metavar="DIR", type=Path,
                        help="create a CA and a server certificate for --host names in DIR")
    enroll.add_argument("--host", action="append", default=[],
                        help="DNS name or IP address for the server certificate (repeatable)")
    enroll.add_argument("--new-signing-key", metavar="DIR", type=Path,
                        help="make a replacement placement-signing key in DIR (the one there is "
                             "kept) and print its public key for every agent's placement_key")
    enroll.add_argument("--signing-key", metavar="FILE", default=settings.signing_key,
                        help="the placement-signing key (HULK_SIGNING_KEY): print its public key "
                             "as placement_key for the agent to pin")
    enroll.add_argument("--json", action="store_true", help="print the credentials as JSON")
    enroll.set_defaults(func=run_enroll)

    revoke = sub.add_parser("revoke", help="end a node's gRPC token and broker account")
    revoke.add_argument("node_id", metavar="NODE_ID")
    _common(revoke, settings)
    revoke.set_defaults(func=run_revoke)


def _common(parser: argparse.ArgumentParser, settings: PlannerSettings) -> None:
    parser.add_argument("--db", type=Path, default=settings.db,
                        help="the planner's SQLite file (HULK_DB)")
    parser.add_argument("--mqtt-passwd", type=Path, metavar="FILE",
                        help="mosquitto password_file to update (with mosquitto_passwd)")
    parser.add_argument("--mqtt-acl", type=Path, metavar="FILE",
                        help="mosquitto acl_file to regenerate")


def _need_db(args: argparse.Namespace) -> Path:
    if not args.db:
        raise InputError("expected --db PATH (or HULK_DB): the planner's SQLite file", field="--db")
    refuse_foreign_file(args.db)     # before the account tables are written into it
    return Path(args.db)


def _broker(args: argparse.Namespace, db: Path) -> BrokerAccounts | None:
    if bool(args.mqtt_passwd) != bool(args.mqtt_acl):
        raise InputError("expected both --mqtt-passwd and --mqtt-acl, or neither",
                         field="--mqtt-acl" if args.mqtt_passwd else "--mqtt-passwd")
    if not args.mqtt_passwd:
        return None
    return BrokerAccounts(db, args.mqtt_passwd, args.mqtt_acl)


def run_enroll(args: argparse.Namespace) -> int:
    out: dict[str, str] = {}
    if getattr(args, "new_signing_key", None):
        return _new_signing_key(args)
    if args.init_ca:
        from planner.security.signing import PRIVATE_NAME, init_signing_key
        from planner.security.tls import init_pki  # cryptography is only needed here
        if (args.init_ca / PRIVATE_NAME).exists():  # refuse before making anything
            raise ConfigError(f"{args.init_ca / PRIVATE_NAME} already exists: keeping it (a "
                              "replacement: --new-signing-key DIR)", field="--init-ca")
        paths = init_pki(args.init_ca, args.host)
        out.update({k: str(v) for k, v in paths.items()})
        out.update({k: str(v) for k, v in init_signing_key(args.init_ca).items()})
        if not args.node_id:
            _print(out, args.json)
            return 0
    if not args.node_id:
        raise InputError("expected NODE_ID (or --init-ca DIR)", field="NODE_ID")
    node_id = check_node_id(args.node_id)
    db = _need_db(args)
    broker = _broker(args, db)
    if args.role == "planner":
        if broker is None:
            raise InputError("a planner account is a broker account: expected --mqtt-passwd and "
                             "--mqtt-acl", field="--role")
        account = broker.add(node_id, role="planner")
        out.update({"mqtt_username": account.username, "mqtt_password": account.password,
                    "mqtt_may": "read and write hulk/v1/#"})
        _print(out, args.json)
        return 0
    store = CredentialStore(db)
    try:
        issued = store.issue(node_id)
    finally:
        store.close()
    out.update({"node_id": node_id, "token": issued.token})
    if args.signing_key:
        from hulk.wire.signing import Signer
        out["placement_key"] = Signer.from_file(args.signing_key).public_text()
    if broker is not None:
        account = broker.add(node_id, role="node")
        out.update({"mqtt_username": account.username, "mqtt_password": account.password,
                    "mqtt_may": f"read {placement_topic(node_id)}"})
    _print(out, args.json)
    if not args.json:
        print("# Shown once. On the node put HULK_TOKEN=<token> in /etc/hulk/agent.env (mode 0600)"
              " and the broker account in its mqtt: URL; placement_key (if shown) goes in its"
              " placement_key setting; then `systemctl reload mosquitto`.",
              file=sys.stderr)
    return 0


def _new_signing_key(args: argparse.Namespace) -> int:
    from planner.security.signing import new_signing_key

    if args.node_id or args.init_ca:
        raise InputError("--new-signing-key DIR makes a key only: give no NODE_ID or --init-ca",
                         field="--new-signing-key")
    made = new_signing_key(args.new_signing_key)
    _print({k: str(v) for k, v in made.items()}, args.json)
    if not args.json:
        print("# Next: add placement_key to every agent's placement_key list (keep the old key "
              "there too) and restart the agents; then restart serve with --signing-key "
              f"{made['signing_key']} --previous-placement-key <the old .pub>; deploy/INSTALL.md, "
              "'Rotating the placement-signing key'.", file=sys.stderr)
    return 0


def run_revoke(args: argparse.Namespace) -> int:
    node_id = check_node_id(args.node_id)
    db = _need_db(args)
    broker = _broker(args, db)
    store = CredentialStore(db)
    ended = []
    try:
        try:
            store.revoke(node_id)
            ended.append("gRPC token")
        except NotFoundError:
            pass
    finally:
        store.close()
    if broker is not None:
        try:
            broker.remove(node_id)
            ended.append("broker account")
        except NotFoundError:
            pass
    if not ended:
        raise NotFoundError(f"node {node_id!r} has no live credential to revoke")
    print(f"revoked {node_id}: {', '.join(ended)}"
          + ("; reload the broker (systemctl reload mosquitto)" if broker else ""))
    return 0


def _print(values: dict[str, str], as_json: bool) -> None:
    if as_json:
        print(json.dumps(values))
    else:
        for key, value in values.items():
            print(f"{key}: {value}")
