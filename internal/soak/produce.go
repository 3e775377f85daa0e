package soak

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/outbox"
)

// ledger is the soak's own record of what the producers committed and
// rolled back, kept outside the database: the reference the topic and the
// applied side effects are judged against.
type ledger struct {
	mu         sync.Mutex
	committed  map[string]evRef
	rolledBack map[string]bool
	// seqs per source, in commit order, to prove they are gap-free.
	seqs     map[string][]int64
	partial  []string // transactions whose outcome was neither all nor nothing
	unknown  int      // commits whose outcome had to be looked up
	attempts atomic.Int64
	n        atomic.Int64 // committed events
	rb       atomic.Int64 // rolled-back events
	txns     atomic.Int64 // committed transactions
	viaSQL   atomic.Int64 // committed events enqueued through onceflow.enqueue
	longTxns atomic.Int64 // committed long transactions
	retries  atomic.Int64 // transactions retried (deadlock, connection lost)
	// snapshots held to their end, and for how long in all
	snapshots, snapshotMs atomic.Int64
}

type evRef struct {
	db, topic, source string
	seq               int64
	at                time.Time // when it committed (as the producer saw it)
}

// streamKey names one stream (I5): what one producing database wrote for
// one topic and source. Seqs are per stream, so order and gaps are judged
// per stream.
func streamKey(db, topic, source string) string { return db + "/" + topic + "/" + source }

func newLedger() *ledger {
	return &ledger{committed: map[string]evRef{}, rolledBack: map[string]bool{}, seqs: map[string][]int64{}}
}

func (l *ledger) commit(evs []enqueued, viaSQL int) {
	now := time.Now()
	l.mu.Lock()
	for _, e := range evs {
		l.committed[e.id] = evRef{e.db, e.topic, e.source, e.seq, now}
		k := streamKey(e.db, e.topic, e.source)
		l.seqs[k] = append(l.seqs[k], e.seq)
	}
	l.mu.Unlock()
	l.n.Add(int64(len(evs)))
	l.txns.Add(1)
	l.viaSQL.Add(int64(viaSQL))
}

func (l *ledger) rollback(evs []enqueued) {
	l.mu.Lock()
	for _, e := range evs {
		l.rolledBack[e.id] = true
	}
	l.mu.Unlock()
	l.rb.Add(int64(len(evs)))
}

// enqueued is one event a transaction enqueued: in producing database db,
// for topic.
type enqueued struct {
	id, source string
	seq        int64
	db, topic  string
}

// txSpec is one producer transaction.
type txSpec struct {
	msgs     []outbox.Message
	path     string // "go", "go-batch" or "sql"
	rollback bool
	hold     time.Duration
}

// producer writes the load: transactions through both enqueue paths, some
// rolled back, some held open, paced to a target rate; and a probe stream.
type producer struct {
	pool *pgxpool.Pool
	led  *ledger
	// db names the producing database ("a", "b"); every payload carries it
	// so that the consumers' handlers can record which stream an event is
	// of.
	db string
	// topics are the event topics a writer spreads a transaction's events
	// over: one source writes to several topics.
	topics []string
	seed   uint64
	// hard ends even the finishing of begun transactions (the run was
	// interrupted).
	hard    context.Context
	errs    atomic.Int64
	lastErr atomic.Pointer[string]
}

const sourcesPerRun = 120

// runWriter is one writer: it paces its transactions to rate events per
// second until ctx ends (a begun transaction is always finished).
func (p *producer) runWriter(ctx context.Context, w int, rate float64) {
	rng := rand.New(rand.NewPCG(p.seed, uint64(w)+1))
	next := time.Now()
	for n := 0; ctx.Err() == nil; n++ {
		spec := p.nextTx(rng, w, n)
		next = next.Add(time.Duration(float64(len(spec.msgs)) / rate * float64(time.Second)))
		if d := time.Until(next); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d):
			}
		} else if d < -time.Minute {
			// Far behind after an outage: catch up on the last minute's
			// load, not on all of it.
			next = time.Now().Add(-time.Minute)
		}
		p.do(ctx, rng, spec)
	}
}

func (p *producer) nextTx(rng *rand.Rand, w, n int) txSpec {
	k := 1 + rng.IntN(4)
	spec := txSpec{rollback: rng.IntN(100) < 8}
	switch r := rng.IntN(10); {
	case r < 4:
		spec.path = "go"
	case r < 7:
		spec.path = "go-batch"
	default:
		spec.path = "sql"
	}
	if rng.IntN(100) < 3 {
		spec.hold = time.Duration(50+rng.IntN(450)) * time.Millisecond
	}
	for j := range k {
		m := outbox.Message{
			// Every database writes the same source names, each source to
			// every topic.
			Topic:     p.topics[rng.IntN(len(p.topics))],
			Source:    fmt.Sprintf("src-%03d", rng.IntN(sourcesPerRun)),
			EventType: "soak.event",
			Payload:   fmt.Appendf(nil, `{"db":%q,"w":%d,"n":%d,"j":%d}`, p.db, w, n, j),
		}
		if rng.IntN(2) == 0 { // half carry a natural key, half get a generated UUID
			m.EventID = fmt.Sprintf("soak-%s-%x-w%d-%d-%d", p.db, p.seed&0xffff, w, n, j)
		}
		spec.msgs = append(spec.msgs, m)
	}
	return spec
}

// runLong opens a long transaction every few seconds on sources of its
// own and holds it 2–20 s before committing (or rolling back): its rows get
// lower ids than rows committed meanwhile, the late-committer case.
func (p *producer) runLong(ctx context.Context) {
	rng := rand.New(rand.NewPCG(p.seed, 999+uint64(len(p.db))*uint64(p.db[0])))
	for n := 0; ctx.Err() == nil; n++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(2000+rng.IntN(6000)) * time.Millisecond):
		}
		spec := txSpec{path: "go-batch", rollback: rng.IntN(5) == 0, hold: time.Duration(2+rng.IntN(19)) * time.Second}
		if rng.IntN(2) == 0 {
			spec.path = "sql"
		}
		for j := range 1 + rng.IntN(3) {
			spec.msgs = append(spec.msgs, outbox.Message{
				Topic: p.topics[rng.IntN(len(p.topics))], Source: fmt.Sprintf("long-%d", rng.IntN(4)), EventType: "soak.long",
				Payload: fmt.Appendf(nil, `{"db":%q,"long":%d,"j":%d}`, p.db, n, j),
			})
		}
		if _, _, ok := p.do(ctx, rng, spec); ok && !spec.rollback {
			p.led.longTxns.Add(1)
		}
	}
}

// do runs spec to its end: retried on deadlocks and lost connections until
// it commits or rolls back as planned. It returns the committed events and
// when their transaction began, and whether spec finished as planned.
func (p *producer) do(ctx context.Context, rng *rand.Rand, spec txSpec) ([]enqueued, time.Time, bool) {
	// Once begun, a transaction is finished even when ctx ends: the ledger
	// must know exactly what was committed.
	tctx := context.WithoutCancel(ctx)
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			p.led.retries.Add(1)
			if ctx.Err() != nil && attempt > 3 {
				return nil, time.Time{}, false
			}
			time.Sleep(time.Duration(min(50*attempt, 2000)+rng.IntN(50)) * time.Millisecond)
		}
		evs, began, err := p.attempt(tctx, spec)
		if err == nil {
			return evs, began, true
		}
		p.errs.Add(1)
		msg := err.Error()
		p.lastErr.Store(&msg)
		if len(evs) > 0 {
			// Every path that returns an error with events left the
			// transaction rolled back (an unknown commit outcome was
			// resolved before).
			p.led.rollback(evs)
		}
		if errors.Is(err, errPartialCommit) {
			return nil, time.Time{}, false
		}
	}
}

var errPartialCommit = errors.New("partial commit")

// attempt runs one try of spec and returns its events and when it began.
// On success they are in the ledger (committed, or rolled back as
// planned). An error means nothing of this try committed.
func (p *producer) attempt(ctx context.Context, spec txSpec) (evs []enqueued, began time.Time, err error) {
	p.led.attempts.Add(1)
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second+spec.hold)
	defer cancel()
	began = time.Now()
	tx, err := p.pool.Begin(qctx)
	if err != nil {
		return nil, began, fmt.Errorf("begin: %w", err)
	}
	pid := tx.Conn().PgConn().PID()
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
	viaSQL := 0
	switch spec.path {
	case "go":
		for _, m := range spec.msgs {
			r, err := outbox.Enqueue(qctx, tx, m)
			if err != nil {
				return evs, began, fmt.Errorf("enqueue: %w", err)
			}
			evs = append(evs, enqueued{id: r.EventID, source: m.Source, seq: r.Seq, db: p.db, topic: m.Topic})
		}
	case "go-batch":
		rs, err := outbox.EnqueueBatch(qctx, tx, spec.msgs)
		if err != nil {
			return evs, began, fmt.Errorf("enqueue batch: %w", err)
		}
		for i, r := range rs {
			evs = append(evs, enqueued{id: r.EventID, source: spec.msgs[i].Source, seq: r.Seq, db: p.db, topic: spec.msgs[i].Topic})
		}
	case "sql":
		for _, m := range spec.msgs {
			var id *string
			if m.EventID != "" {
				id = &m.EventID
			}
			var e enqueued
			if err := tx.QueryRow(qctx, `SELECT event_id, seq FROM onceflow.enqueue($1, $2, $3, $4::jsonb, $5)`,
				m.Topic, m.Source, m.EventType, string(m.Payload), id).Scan(&e.id, &e.seq); err != nil {
				return evs, began, fmt.Errorf("onceflow.enqueue: %w", err)
			}
			e.source, e.db, e.topic = m.Source, p.db, m.Topic
			evs = append(evs, e)
			viaSQL++
		}
	}
	if spec.hold > 0 {
		select {
		case <-time.After(spec.hold): // a transaction that stays open, on purpose
		case <-qctx.Done():
			return evs, began, qctx.Err()
		}
	}
	if spec.rollback {
		_ = tx.Rollback(qctx)
		p.led.rollback(evs)
		return nil, began, nil
	}
	if err := tx.Commit(qctx); err != nil {
		committed, rerr := p.resolve(ctx, pid, began, evs)
		if rerr != nil {
			return nil, began, rerr
		}
		if !committed {
			return evs, began, fmt.Errorf("commit: %w", err)
		}
	}
	p.led.commit(evs, viaSQL)
	return evs, began, nil
}

// resolve finds out whether a transaction whose COMMIT got no answer
// committed: it waits until the server has no backend with the
// transaction's pid (or restarted since), so that the outcome is final,
// then counts the transaction's rows. A transaction that committed only
// part of its rows is an anomaly.
func (p *producer) resolve(ctx context.Context, pid uint32, began time.Time, evs []enqueued) (bool, error) {
	p.led.mu.Lock()
	p.led.unknown++
	p.led.mu.Unlock()
	ids := make([]string, len(evs))
	for i, e := range evs {
		ids[i] = e.id
	}
	for {
		var gone bool
		var n int
		err := p.pool.QueryRow(ctx, `SELECT pg_postmaster_start_time() > $2
		        OR NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND backend_start <= $2),
		    (SELECT count(*) FROM onceflow.outbox_keys WHERE event_id = ANY($3))`, int32(pid), began, ids).Scan(&gone, &n)
		if err == nil && gone {
			switch n {
			case len(ids):
				return true, nil
			case 0:
				return false, nil
			}
			p.led.mu.Lock()
			p.led.partial = append(p.led.partial, fmt.Sprintf("%d of %d rows of a transaction committed: %v", n, len(ids), ids))
			p.led.mu.Unlock()
			return false, errPartialCommit
		}
		select {
		case <-p.hard.Done():
			return false, fmt.Errorf("outcome of a commit not known when the run was interrupted: %w", errPartialCommit)
		case <-time.After(200 * time.Millisecond): // the server is down or the backend still ends
		}
	}
}

// holdSnapshots keeps a REPEATABLE READ transaction open in the producing
// database, hold at a time, until ctx ends: a snapshot that holds back the
// xmin horizon (vacuum, and any design that waits for the oldest snapshot)
// for minutes while the load goes on. A lost connection (a fault) ends the
// snapshot early; the next opens a second later.
func (p *producer) holdSnapshots(ctx context.Context, hold time.Duration) {
	for ctx.Err() == nil {
		if d, err := p.holdSnapshot(ctx, hold); err == nil {
			p.led.snapshots.Add(1)
			p.led.snapshotMs.Add(d.Milliseconds())
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (p *producer) holdSnapshot(ctx context.Context, hold time.Duration) (time.Duration, error) {
	t0 := time.Now()
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ`); err != nil {
		return 0, err
	}
	// The snapshot is taken by the first query; the count keeps it honest.
	var n int64
	err = conn.QueryRow(ctx, `SELECT count(*) FROM onceflow.outbox`).Scan(&n)
	if err == nil {
		select {
		case <-ctx.Done():
		case <-time.After(hold):
		}
	}
	_, cerr := conn.Exec(context.WithoutCancel(ctx), `COMMIT`)
	if err == nil {
		err = cerr
	}
	return time.Since(t0), err
}
