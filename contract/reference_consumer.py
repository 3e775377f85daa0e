#!/usr/bin/env python3
"""Reference consumer for onceflow topics, written from docs/contract.md only.

Reads `kcat -C -J -e -X isolation.level=read_committed` output (one JSON
object per line) on stdin and applies the events the way the contract tells a
consumer to:

  * deduplicate by the `event-id` header,
  * apply each stream's events in `seq` order, starting at 1, parking an
    event that arrives ahead of a gap until the gap is filled. A stream is
    (producer, topic, source); a record without a `producer` header belongs
    to its source's legacy stream (the source alone).

For every applied event it prints one JSON line on stdout:
  {"event_id": ..., "producer": ..., "source": ..., "seq": ..., "event_type": ..., "value": ...}
and at the end one JSON summary line on stderr. The exit status is 0 when
every event was applied, 2 when events are still parked behind a gap (their
streams and the missing seqs are in the summary), 1 on a record that breaks
the contract.

Python 3 standard library only. Keep the state durable in a real consumer:
here it lives in memory because the input is finite.
"""

import json
import sys

REQUIRED = ("event-id", "source", "seq", "event-type", "content-type")


class ContractError(Exception):
    pass


def headers_of(rec):
    """kcat prints headers as [name, value, name, value, ...]."""
    raw = rec.get("headers") or []
    if len(raw) % 2:
        raise ContractError("odd headers array")
    out = {}
    for name, value in zip(raw[0::2], raw[1::2]):
        if name in out:
            raise ContractError("header %r appears twice" % name)
        out[name] = value
    for name in REQUIRED:
        if not out.get(name):
            raise ContractError("header %r is missing or empty" % name)
    if "producer" in out and not out["producer"]:
        raise ContractError("header 'producer' is empty")
    return out


def stream_of(ev):
    """The stream an event is ordered in, as a printable key."""
    if not ev["producer"]:
        return ev["source"]  # the legacy stream: the source alone
    return "%s/%s/%s" % (ev["producer"], ev["topic"], ev["source"])


def parse_seq(text):
    if not text.isascii() or not text.isdigit() or text[0] == "0" or len(text) > 19:
        raise ContractError("seq %r is not a positive decimal integer" % text)
    return int(text)


class Consumer:
    def __init__(self, out):
        self.out = out
        self.applied_ids = set()  # dedup ledger: event-ids already applied
        self.next_seq = {}        # stream -> next seq to apply (1 when unseen)
        self.parked = {}          # stream -> {seq: event}
        self.duplicates = 0
        self.applied = 0

    def receive(self, rec):
        h = headers_of(rec)
        ev = {
            "event_id": h["event-id"],
            "producer": h.get("producer", ""),
            "topic": rec.get("topic", ""),
            "source": h["source"],
            "seq": parse_seq(h["seq"]),
            "event_type": h["event-type"],
            "value": rec.get("payload"),
        }
        if ev["event_id"] in self.applied_ids:
            self.duplicates += 1
            return
        src, seq = stream_of(ev), ev["seq"]
        want = self.next_seq.get(src, 1)
        if seq < want:
            # Its position was filled by an event with another id: a copy the
            # ledger does not know (e.g. it was parked twice). Already applied.
            self.duplicates += 1
            return
        if seq > want:
            parked = self.parked.setdefault(src, {})
            if seq in parked:
                self.duplicates += 1
            else:
                parked[seq] = ev
            return
        self.apply(ev)
        parked = self.parked.get(src, {})
        while self.next_seq[src] in parked:
            self.apply(parked.pop(self.next_seq[src]))
        if not parked:
            self.parked.pop(src, None)

    def apply(self, ev):
        self.applied_ids.add(ev["event_id"])
        self.next_seq[stream_of(ev)] = ev["seq"] + 1
        self.applied += 1
        self.out.write(json.dumps(ev, sort_keys=True) + "\n")

    def summary(self):
        gaps = {
            src: {"next_seq": self.next_seq.get(src, 1), "parked": sorted(p)}
            for src, p in self.parked.items()
        }
        return {"applied": self.applied, "duplicates": self.duplicates, "gaps": gaps}


def main():
    c = Consumer(sys.stdout)
    # Payloads are bytes; kcat writes them raw. Undecodable bytes must not
    # stop the consumer, so decode leniently.
    stdin = open(sys.stdin.fileno(), "r", encoding="utf-8", errors="surrogateescape", closefd=False)
    for n, line in enumerate(stdin, 1):
        line = line.strip()
        if not line:
            continue
        try:
            c.receive(json.loads(line))
        except (ContractError, ValueError) as e:
            sys.stderr.write(json.dumps({"error": "line %d: %s" % (n, e)}) + "\n")
            return 1
    s = c.summary()
    sys.stderr.write(json.dumps(s, sort_keys=True) + "\n")
    return 2 if s["gaps"] else 0


if __name__ == "__main__":
    sys.exit(main())
