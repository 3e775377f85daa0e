package soak

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// AnomalyReplica prefixes a finding of the replica check: a row committed
// at b's source that b's outbox (where b's relay publishes from) does not
// hold as the source wrote it ("replica:missing", "replica:differs"), or a
// row in b's outbox the source never committed ("replica:phantom").
const AnomalyReplica = "replica"

const whereReplica = "replica"

// ReplicaCheck is what the replica check compared: the outbox rows of b's
// source and of b (the subscriber) created in the window.
type ReplicaCheck struct {
	SourceRows     int64   `json:"source_rows"`
	SubscriberRows int64   `json:"subscriber_rows"`
	Seconds        float64 `json:"seconds"`
}

// outboxRow is what the replica check compares of one outbox row: the
// apply worker must write the source's id, event id, stream and seq.
type outboxRow struct {
	eventID, topic, source string
	seq                    int64
}

// checkReplica compares the outbox of each database fed by logical
// replication with its source's, row by row, for the rows created from
// from on (the subscriber's relay prunes published rows after its
// retention; the source keeps every row). With the ledger's check of the
// topic and the reconcile check of the subscriber, it closes the chain:
// what the producers committed at the source is in the subscriber's
// outbox, and what is there was published and applied once, in order.
func (r *run) checkReplica(ctx context.Context, from time.Time, rep *Report) []Anomaly {
	var out []Anomaly
	for _, d := range r.dbs {
		if d.srcPool == nil {
			continue
		}
		t0 := time.Now()
		where := fmt.Sprintf("%s (database %s and its source)", whereReplica, d.name)
		src, err := readOutbox(ctx, d.srcPool, from)
		var sub map[int64]outboxRow
		if err == nil {
			sub, err = readOutbox(ctx, d.pool, from)
		}
		if err != nil {
			out = append(out, Anomaly{Kind: AnomalyReplica, Where: where, Count: 1, Examples: []string{"could not run: " + err.Error()}})
			continue
		}
		rep.Replica = &ReplicaCheck{SourceRows: int64(len(src)), SubscriberRows: int64(len(sub)), Seconds: time.Since(t0).Seconds()}
		out = append(out, compareReplica(src, sub, where)...)
	}
	return out
}

// compareReplica finds the rows of src that sub lacks or holds otherwise,
// and the rows of sub that src lacks.
func compareReplica(src, sub map[int64]outboxRow, where string) []Anomaly {
	var missing, differs, phantom []string
	for id, s := range src {
		b, ok := sub[id]
		switch {
		case !ok:
			missing = append(missing, fmt.Sprintf("outbox id %d (%s, %s/%s seq %d)", id, s.eventID, s.topic, s.source, s.seq))
		case b != s:
			differs = append(differs, fmt.Sprintf("outbox id %d: %s %s/%s seq %d at the source, %s %s/%s seq %d here",
				id, s.eventID, s.topic, s.source, s.seq, b.eventID, b.topic, b.source, b.seq))
		}
	}
	for id, b := range sub {
		if _, ok := src[id]; !ok {
			phantom = append(phantom, fmt.Sprintf("outbox id %d (%s, %s/%s seq %d)", id, b.eventID, b.topic, b.source, b.seq))
		}
	}
	var out []Anomaly
	for _, x := range []struct {
		kind string
		ex   []string
	}{{"missing", missing}, {"differs", differs}, {"phantom", phantom}} {
		if len(x.ex) > 0 {
			out = append(out, Anomaly{Kind: AnomalyReplica + ":" + x.kind, Where: where, Count: len(x.ex), Examples: first(x.ex, maxExamples)})
		}
	}
	return out
}

// readOutbox reads the outbox rows created from from on.
func readOutbox(ctx context.Context, pool *pgxpool.Pool, from time.Time) (map[int64]outboxRow, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	rows, err := pool.Query(ctx, `SELECT id, event_id, topic, source, seq FROM onceflow.outbox WHERE created_at >= $1`, from)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	m := map[int64]outboxRow{}
	for rows.Next() {
		var id int64
		var o outboxRow
		if err := rows.Scan(&id, &o.eventID, &o.topic, &o.source, &o.seq); err != nil {
			return nil, err
		}
		m[id] = o
	}
	return m, rows.Err()
}
