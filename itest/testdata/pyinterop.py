"""The Python side of itest/agents_python_test.go, run with the package's
virtual environment. The database is $ONCEFLOW_DATABASE_URL. Each command
prints one JSON line per result.

  fence KEY CODE SUMMARY [SCOPE]
                             fenced(KEY, SCOPE): record CODE and SUMMARY (JSON) unless replayed
  hold KEY                   fenced(KEY): print "holding", wait for a line on stdin, record 201
  agent TOPIC URL CONSUMER ENTRY
                             enqueue 3 events in one transaction; the first one's effect
                             is sent from here (POST URL with Idempotency-Key), fenced by
                             event_key in consumer_scope(CONSUMER, ENTRY): the scope of that
                             consumer's http handler entry
  enqueue EVENTS             enqueue each event of the JSON list EVENTS ({"topic", "source",
                             "event_type", "payload", "event_id"}) in one transaction
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request

import psycopg

from onceflow import consumer_scope, enqueue, event_key, fenced


def out(**kv: object) -> None:
    print(json.dumps(kv, sort_keys=True), flush=True)


def main(argv: list[str]) -> int:
    cmd = argv[0]
    if cmd == "fence":
        key, code, summary = argv[1], int(argv[2]), json.loads(argv[3])
        scope = argv[4] if len(argv) > 4 else ""
        with fenced(key, scope) as fx:
            if fx.replayed:
                assert fx.result is not None
                out(replayed=True, code=fx.result.code, summary=fx.result.summary, attempts=fx.attempts)
            else:
                r = fx.record(code, summary)
                out(replayed=False, code=r.code, summary=r.summary, attempts=fx.attempts)
        return 0
    if cmd == "hold":
        with fenced(argv[1]) as fx:
            out(holding=fx.key, replayed=fx.replayed)
            sys.stdin.readline()
            fx.record(201, {"by": "python"})
        out(recorded=argv[1])
        return 0
    if cmd == "agent":
        topic, url, consumer, entry = argv[1], argv[2], argv[3], argv[4]
        with psycopg.connect(os.environ["ONCEFLOW_DATABASE_URL"]) as conn:
            ids = [enqueue(conn, topic, "agent-7", "email.send", {"to": f"user{i}@example.com"}, event_id=f"py-ev-{i}").event_id
                   for i in range(1, 4)]
            conn.commit()
        # The agent sends the first event's e-mail itself, fenced by the
        # event's key in the scope of the consumer's http handler, before the
        # consumer gets to it.
        scope = consumer_scope(consumer, entry)
        with fenced(event_key(ids[0]), scope, event_id=ids[0]) as fx:
            if not fx.replayed:
                req = urllib.request.Request(url, data=b"{}", method="POST",
                                             headers={"Idempotency-Key": fx.key, "Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=10) as resp:
                    fx.record(resp.status, {"sent_by": "python"})
        out(enqueued=ids, scope=scope)
        return 0
    if cmd == "enqueue":
        with psycopg.connect(os.environ["ONCEFLOW_DATABASE_URL"]) as conn:
            done = [enqueue(conn, ev["topic"], ev["source"], ev["event_type"], ev["payload"], event_id=ev["event_id"])
                    for ev in json.loads(argv[1])]
            conn.commit()
        out(enqueued=[{"event_id": d.event_id, "seq": d.seq} for d in done])
        return 0
    print(f"unknown command {cmd}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
