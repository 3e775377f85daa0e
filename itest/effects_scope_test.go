package itest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/effects"
	"github.com/onceflow/onceflow/pkg/envelope"
	"github.com/onceflow/onceflow/pkg/handlerfile"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/retention"
)

// TestEffectsTwoConsumerNames: two logical consumers (two deployments that
// must each apply every event) read one topic with http handlers on the
// same event type, each pointing at its own server. Each server's business
// logic runs once per event — the second consumer does not find the first
// one's ledger row and skip its call. Then the first consumer's retention
// prunes its own inbox rows and effects and leaves the other's ledger whole.
func TestEffectsTwoConsumerNames(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL and Kafka")
	}
	db := testkit.NewDB(t)
	ctx := context.Background()
	const n = 60
	topic := testkit.Topic(t, "twonames", 2, nil)
	var evs []envelope.Envelope
	for i := range n {
		evs = append(evs, envelope.Envelope{EventID: fmt.Sprintf("pay-%03d", i), Source: fmt.Sprintf("payer-%d", i%6), Seq: int64(i/6 + 1),
			EventType: "payment.requested", Payload: fmt.Appendf(nil, `{"amount":%d}`, i)})
	}
	produce(t, testkit.Client(t), topic, evs...)
	servers := map[string]*idemServer{}
	engines := map[string]*engine{}
	for _, name := range []string{"billing", "audit"} {
		srv, hs := newIdemServer(t)
		servers[name] = srv
		h, err := handlerfile.Parse(fmt.Appendf(nil, `{"handlers": [{"event_type": "payment.requested", "kind": "http", "http": {"url": %q}}]}`, hs.URL+"/"+name))
		if err != nil {
			t.Fatal(err)
		}
		engines[name] = startEngine(t, inbox.Config{Pool: db.Pool, ConsumerName: name, Group: "g-" + name + "-" + topic,
			Topics: []string{topic}, BatchHandler: h, BatchMaxRecords: 7})
	}
	for name, e := range engines {
		eventually(t, 60*time.Second, name+" applied every event", func() (bool, string) {
			p := e.metric("onceflow_consumer_processed_total")
			return p == n, fmtState(name, " processed ", p)
		})
		e.stop(t)
	}
	for name, srv := range servers {
		requests, business := srv.snapshot()
		if len(business) != n {
			t.Errorf("%s's server ran its business logic for %d keys, want %d", name, len(business), n)
		}
		for _, ev := range evs {
			if c := business["event:"+ev.EventID]; c != 1 {
				t.Errorf("%s's server: key event:%s ran %d times, want 1", name, ev.EventID, c)
			}
		}
		t.Logf("%s: %d requests, %d keys, business logic once per key", name, requests, len(business))
	}
	for _, name := range []string{"billing", "audit"} {
		scope := effects.ConsumerScope(name, "http", "payment.requested")
		if c := count(t, db, `SELECT count(*) FROM onceflow.effects WHERE scope = $1 AND status = 'done'`, scope); c != n {
			t.Fatalf("%d done ledger rows in scope %s, want %d", c, scope, n)
		}
	}

	// Retention, two hours on: billing prunes its own rows only.
	r, err := retention.Parse([]byte(`{"classes":[{"match":"payment.*","keep":"1h"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	st, err := retention.Prune(ctx, db.Pool, r, retention.Options{Consumer: "billing", Now: func() time.Time { return time.Now().Add(2 * time.Hour) }})
	if err != nil || st.Inbox != n || st.Effects != n {
		t.Fatalf("billing's prune: %+v, %v; want %d inbox rows and %d effects", st, err, n, n)
	}
	if c := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE consumer = 'billing'`); c != 0 {
		t.Fatalf("%d of billing's inbox rows left", c)
	}
	if c := count(t, db, `SELECT count(*) FROM onceflow.inbox WHERE consumer = 'audit' AND status = 'processed'`); c != n {
		t.Fatalf("audit's inbox: %d rows, want %d", c, n)
	}
	if c := count(t, db, `SELECT count(*) FROM onceflow.effects WHERE scope = $1 AND status = 'done'`, effects.ConsumerScope("audit", "http", "payment.requested")); c != n {
		t.Fatalf("audit's ledger: %d done rows after billing's prune, want %d", c, n)
	}
	t.Logf("%d events, 2 consumer names; billing pruned %d inbox rows and %d effects, audit's %d rows untouched", n, st.Inbox, st.Effects, n)
}
