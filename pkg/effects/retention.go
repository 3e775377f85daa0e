package effects

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Retention maps event-type classes to how long their dedup rows are kept,
// and declares how long each source may redeliver:
//
//	{
//	  "classes": [
//	    {"match": "payment.*", "keep": "permanent"},
//	    {"match": "telemetry.*", "keep": "72h"},
//	    {"match": "*", "keep": "720h"}
//	  ],
//	  "sources": [
//	    {"source": "stripe-webhooks", "horizon": "72h", "event_types": ["payment.*", "telemetry.ping"]}
//	  ]
//	}
//
// Classes are globs (path.Match) over the event type, first match wins; a
// type no class matches is kept permanently. A class's TTL shorter than the
// horizon of a source that sends a type of that class is rejected: the
// source could redeliver an event after its inbox row was pruned.
type Retention struct {
	Classes []Class  `json:"classes"`
	Sources []Source `json:"sources,omitempty"`
}

// Class is one rule: event types matching Match are kept for Keep
// ("permanent" or a Go duration).
type Class struct {
	Match string `json:"match"`
	Keep  string `json:"keep"`

	permanent bool
	ttl       time.Duration
}

// Permanent reports whether the class is never pruned.
func (c Class) Permanent() bool { return c.permanent }

// TTL is the class's time to live (zero when permanent).
func (c Class) TTL() time.Duration { return c.ttl }

// Source declares a producer's maximum redelivery horizon and the event
// types (globs) it sends.
type Source struct {
	Source     string   `json:"source"`
	Horizon    string   `json:"horizon"`
	EventTypes []string `json:"event_types"`

	horizon time.Duration
}

// ParseRetention reads and checks a retention configuration.
func ParseRetention(data []byte) (*Retention, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var r Retention
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("retention: parse: %w", err)
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// Validate compiles and checks the configuration.
func (r *Retention) Validate() error {
	if len(r.Classes) == 0 {
		return fmt.Errorf("retention: classes: at least one is required")
	}
	for i := range r.Classes {
		c := &r.Classes[i]
		if _, err := path.Match(c.Match, ""); err != nil || c.Match == "" {
			return fmt.Errorf("retention: classes[%d].match %q is not a glob", i, c.Match)
		}
		if c.Keep == "permanent" {
			c.permanent, c.ttl = true, 0
			continue
		}
		d, err := time.ParseDuration(c.Keep)
		if err != nil || d <= 0 {
			return fmt.Errorf("retention: classes[%d] (%s): keep %q: want \"permanent\" or a positive duration such as \"72h\"", i, c.Match, c.Keep)
		}
		c.ttl = d
	}
	for i := range r.Sources {
		s := &r.Sources[i]
		if s.Source == "" {
			return fmt.Errorf("retention: sources[%d].source is required", i)
		}
		d, err := time.ParseDuration(s.Horizon)
		if err != nil || d < 0 {
			return fmt.Errorf("retention: sources[%d] (%s): horizon %q: want a duration such as \"72h\"", i, s.Source, s.Horizon)
		}
		s.horizon = d
		if len(s.EventTypes) == 0 {
			return fmt.Errorf("retention: sources[%d] (%s): event_types: at least one is required", i, s.Source)
		}
		for _, et := range s.EventTypes {
			c, ok := r.ClassOf(et)
			if ok && !c.permanent && c.ttl < s.horizon {
				return fmt.Errorf("retention: class %q keeps %s, shorter than source %q's redelivery horizon %s (it sends %q): raise the class's keep to at least %s or make it permanent",
					c.Match, c.ttl, s.Source, s.horizon, et, s.horizon)
			}
		}
	}
	return nil
}

// ClassOf returns the first class whose glob matches eventType (a source's
// declared type may itself be a glob: it is matched as text).
func (r *Retention) ClassOf(eventType string) (Class, bool) {
	for _, c := range r.Classes {
		if ok, _ := path.Match(c.Match, eventType); ok {
			return c, true
		}
	}
	return Class{}, false
}

// ttlOf returns the TTL of eventType's class, or 0 when it is kept.
func (r *Retention) ttlOf(eventType string) time.Duration {
	c, ok := r.ClassOf(eventType)
	if !ok || c.permanent {
		return 0
	}
	return c.ttl
}

func (r *Retention) minTTL() time.Duration {
	var m time.Duration
	for _, c := range r.Classes {
		if !c.permanent && (m == 0 || c.ttl < m) {
			m = c.ttl
		}
	}
	return m
}

// DefaultConsumer is the logical consumer Prune prunes when
// PruneOptions.Consumer is empty (the consumer's own default name).
const DefaultConsumer = "default"

// PruneOptions bound the work of one statement.
type PruneOptions struct {
	// BatchSize is the most rows one DELETE removes (default 500).
	BatchSize int
	// Consumer is the logical consumer whose inbox rows and effects are
	// pruned (default DefaultConsumer). Other consumers' rows are never
	// touched: each prunes its own.
	Consumer string
	// Pause is the wait between batches (default 20ms).
	Pause time.Duration
	// Now is the reference time (default: the database's clock, read once
	// per Prune, so that a replica with a skewed clock prunes nothing early).
	Now func() time.Time
}

// PruneStats counts what one Prune removed.
type PruneStats struct {
	Inbox, Effects, Outbox int64
	// Skipped is true when another replica held the pruning lock.
	Skipped bool
}

// qPruneLock is the try-lock one pruning replica of a consumer holds (the
// ledger's lock class; object hashtext('prune' || E'\n' || consumer), the
// lock DoScoped would take for scope "prune" and the consumer name as key:
// a coincidence that merely serializes).
const (
	qPruneLock   = `SELECT pg_try_advisory_lock($1, hashtext('prune' || E'\n' || $2::text))`
	qPruneUnlock = `SELECT pg_advisory_unlock($1, hashtext('prune' || E'\n' || $2::text))`
)

// Prune deletes, in batches of at most BatchSize rows with Pause between
// them, the rows whose class's TTL has passed:
//   - onceflow.inbox rows of o.Consumer with status processed (never parked,
//     held or dead, and never a late row: an event applied late lies in a
//     given-up range, so only its inbox row tells its redelivery from a
//     first arrival), by received_at;
//   - onceflow.effects rows with status done, in o.Consumer's scopes
//     (ConsumerScopePrefix), whose event's inbox row was pruned in the same
//     batch (an intent is never pruned; another consumer's rows never are);
//   - onceflow.outbox rows already published, by published_at.
//
// Only one replica prunes a consumer at a time (a try-lock: a second Prune
// returns Skipped). onceflow.seq_state is never touched: a redelivery of a pruned
// event of a tracked source is still caught by the sequence guard as late.
func Prune(ctx context.Context, db *pgxpool.Pool, r *Retention, o PruneOptions) (PruneStats, error) {
	var st PruneStats
	if o.BatchSize <= 0 {
		o.BatchSize = 500
	}
	if o.Pause <= 0 {
		o.Pause = 20 * time.Millisecond
	}
	if o.Consumer == "" {
		o.Consumer = DefaultConsumer
	}
	minTTL := r.minTTL()
	if minTTL == 0 {
		return st, nil // everything permanent
	}
	conn, err := db.Acquire(ctx)
	if err != nil {
		return st, err
	}
	defer conn.Release()
	var got bool
	if err := conn.QueryRow(ctx, qPruneLock, lockClass, o.Consumer).Scan(&got); err != nil {
		return st, fmt.Errorf("retention: lock: %w", err)
	}
	if !got {
		st.Skipped = true
		return st, nil
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), qPruneUnlock, lockClass, o.Consumer); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx))
		}
	}()
	var now time.Time
	if o.Now != nil {
		now = o.Now()
	} else if err := conn.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return st, fmt.Errorf("retention: read the database clock: %w", err)
	}
	scopePrefix := ConsumerScopePrefix(o.Consumer)
	pause := func() error {
		t := time.NewTimer(o.Pause)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		}
	}

	// The consumer's inbox rows (and the effects of the pruned events),
	// keyset by (received_at, event_id).
	var (
		lastAt    = time.Time{}
		lastEvent string
	)
	for {
		rows, err := conn.Query(ctx, `SELECT event_id, event_type, received_at FROM onceflow.inbox
		  WHERE consumer = $1 AND status = 'processed' AND NOT late AND received_at < $2 AND (received_at, event_id) > ($3, $4)
		  ORDER BY received_at, event_id LIMIT $5`, o.Consumer, now.Add(-minTTL), lastAt, lastEvent, o.BatchSize)
		if err != nil {
			return st, fmt.Errorf("retention: scan inbox: %w", err)
		}
		var ids []string
		n := 0
		for rows.Next() {
			var id, et string
			var at time.Time
			if err := rows.Scan(&id, &et, &at); err != nil {
				rows.Close()
				return st, err
			}
			n++
			lastAt, lastEvent = at, id
			if ttl := r.ttlOf(et); ttl > 0 && at.Before(now.Add(-ttl)) {
				ids = append(ids, id)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return st, fmt.Errorf("retention: scan inbox: %w", err)
		}
		if len(ids) > 0 {
			tag, err := conn.Exec(ctx, `DELETE FROM onceflow.inbox
			  WHERE consumer = $1 AND event_id = ANY($2::text[]) AND status = 'processed' AND NOT late`, o.Consumer, ids)
			if err != nil {
				return st, fmt.Errorf("retention: prune inbox: %w", err)
			}
			st.Inbox += tag.RowsAffected()
			tag, err = conn.Exec(ctx, `DELETE FROM onceflow.effects
			  WHERE status = 'done' AND event_id = ANY($1::text[]) AND starts_with(scope, $2)`, ids, scopePrefix)
			if err != nil {
				return st, fmt.Errorf("retention: prune effects: %w", err)
			}
			st.Effects += tag.RowsAffected()
		}
		if n < o.BatchSize {
			break
		}
		if err := pause(); err != nil {
			return st, err
		}
	}

	// Published outbox rows, keyset by (published_at, id).
	var lastPub time.Time
	var lastID int64
	for {
		rows, err := conn.Query(ctx, `SELECT id, event_type, published_at FROM onceflow.outbox
		  WHERE published_at IS NOT NULL AND published_at < $1 AND (published_at, id) > ($2, $3)
		  ORDER BY published_at, id LIMIT $4`, now.Add(-minTTL), lastPub, lastID, o.BatchSize)
		if err != nil {
			return st, fmt.Errorf("retention: scan outbox: %w", err)
		}
		var del []int64
		n := 0
		for rows.Next() {
			var id int64
			var et string
			var at time.Time
			if err := rows.Scan(&id, &et, &at); err != nil {
				rows.Close()
				return st, err
			}
			n++
			lastPub, lastID = at, id
			if ttl := r.ttlOf(et); ttl > 0 && at.Before(now.Add(-ttl)) {
				del = append(del, id)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return st, fmt.Errorf("retention: scan outbox: %w", err)
		}
		if len(del) > 0 {
			tag, err := conn.Exec(ctx, `DELETE FROM onceflow.outbox WHERE id = ANY($1) AND published_at IS NOT NULL`, del)
			if err != nil {
				return st, fmt.Errorf("retention: prune outbox: %w", err)
			}
			st.Outbox += tag.RowsAffected()
		}
		if n < o.BatchSize {
			break
		}
		if err := pause(); err != nil {
			return st, err
		}
	}
	return st, nil
}
