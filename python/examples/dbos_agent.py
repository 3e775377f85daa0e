"""A DBOS workflow whose step sends an e-mail exactly once, however often
DBOS runs the step: recovery after a crash, ``fork_workflow``, two
processes recovering the same workflow.

    plan (step) ──► send_email (step, fenced) ──► "sent <id> to <to>"

``plan`` reads the recipient from the table ``dbos_agent_recipient`` (an
operator may change it and fork the workflow from ``plan``);
``send_email`` POSTs the e-mail to a mail service with an
``Idempotency-Key`` fenced by the onceflow ledger under
``onceflow.dbos.step_key`` (the workflow's origin, the step, the digest of
its arguments). DBOS's system tables and the ledger live in one database.

Run as a program (the tests do, and SIGKILL it)::

    python dbos_agent.py --db URL --mail-url URL --workflow W [--recover | --resume | --fork-from STEP] [--no-fencing]

Without an option it starts workflow ``W``; with ``--recover`` it launches
DBOS, whose start-up recovery resumes the pending workflows, and waits for
``W``; with ``--resume`` it calls ``DBOS.resume_workflow`` (which runs a
pending workflow again even while another process runs it: an operator's
"unstick" of a workflow whose executor looks dead); with ``--fork-from
STEP`` it forks ``W`` from that step. The last line printed is JSON: the workflow's result and id.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import psycopg
from dbos import DBOS, DBOSConfig, SetWorkflowID

from mailer import FAILPOINT_AFTER_SEND, post_email, rendezvous
from onceflow import current_fence, failpoint
from onceflow.dbos import fenced_step

SCOPE = "dbos-agent"
"""The ledger scope of this agent's effects."""

FAILPOINT_BEFORE_SEND = "dbos-before-send"
"""The step has started, nothing is sent: a pending workflow to recover."""

SETTINGS: dict[str, Any] = {}
"""Set by main before DBOS launches: db, mail_url, fencing, barrier, parties."""


@DBOS.step()
def plan(request: str) -> dict[str, str]:
    with psycopg.connect(SETTINGS["db"]) as conn:
        row = conn.execute("SELECT to_addr FROM dbos_agent_recipient").fetchone()
    to = row[0] if row else "nobody@example.com"
    return {"to": to, "subject": f"Re: {request}", "body": f"Hello {to}, about {request!r}: done."}


def _post(to: str, subject: str, body: str) -> str:
    key = current_fence().key if SETTINGS["fencing"] else None
    _, email_id = post_email(SETTINGS["mail_url"], key, {"to": to, "subject": subject, "body": body})
    return email_id


_fenced_post = fenced_step(SCOPE, name="send_email")(_post)


@DBOS.step()
def send_email(to: str, subject: str, body: str) -> str:
    failpoint.hit(FAILPOINT_BEFORE_SEND)
    rendezvous(SETTINGS["barrier"], SETTINGS["parties"])
    if SETTINGS["fencing"]:
        email_id = _fenced_post(to, subject, body)
    else:
        email_id = _post(to, subject, body)
    failpoint.hit(FAILPOINT_AFTER_SEND)  # DBOS has not recorded this step yet
    return email_id


@DBOS.workflow()
def send_workflow(request: str) -> str:
    email = plan(request)
    email_id = send_email(email["to"], email["subject"], email["body"])
    return f"sent {email_id} to {email['to']}"


def step_id(workflow_id: str, name: str) -> int:
    for s in DBOS.list_workflow_steps(workflow_id):
        if s["function_name"].rsplit(".", 1)[-1] == name:
            return s["function_id"]
    raise SystemExit(f"workflow {workflow_id} has no step {name}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--db", required=True)
    ap.add_argument("--mail-url", required=True)
    ap.add_argument("--workflow", required=True)
    ap.add_argument("--request", default="the quarterly report")
    ap.add_argument("--recover", action="store_true")
    ap.add_argument("--resume", action="store_true", help="DBOS.resume_workflow: run it again even if it is running elsewhere")
    ap.add_argument("--fork-from")
    ap.add_argument("--no-fencing", action="store_true")
    ap.add_argument("--barrier", help="a directory where racing runners meet before the send")
    ap.add_argument("--parties", type=int, default=2)
    args = ap.parse_args(argv)
    SETTINGS.update(
        db=args.db, mail_url=args.mail_url, fencing=not args.no_fencing, barrier=args.barrier, parties=args.parties
    )
    # The fence's database: the same one as DBOS's system tables.
    os.environ["ONCEFLOW_DATABASE_URL"] = args.db
    config: DBOSConfig = {"name": "onceflow-dbos-agent", "system_database_url": args.db, "log_level": "WARNING"}
    DBOS(config=config)
    DBOS.launch()
    try:
        if args.fork_from:
            handle = DBOS.fork_workflow(args.workflow, step_id(args.workflow, args.fork_from))
        elif args.resume:
            handle = DBOS.resume_workflow(args.workflow)
        elif args.recover:
            handle = DBOS.retrieve_workflow(args.workflow)
        else:
            with SetWorkflowID(args.workflow):
                handle = DBOS.start_workflow(send_workflow, args.request)
        result = handle.get_result()
        print(json.dumps({"result": result, "workflow_id": handle.get_workflow_id()}), flush=True)
    finally:
        DBOS.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
