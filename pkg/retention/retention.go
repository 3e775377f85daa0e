// Package retention prunes the dedup rows of onceflow's tables by event
// class: the retention file's format and checks, the pruning pass and its
// metrics. Each table's own package owns the statements that read and
// delete its rows; this package decides which rows have expired.
package retention

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onceflow/onceflow/pkg/effects"
	"github.com/onceflow/onceflow/pkg/inbox"
	"github.com/onceflow/onceflow/pkg/relay/admin"
)

// lockClass is the first key of the pruning try-lock: the class of the
// effects ledger's two-int advisory locks (onceflow.effect_claim takes
// (x'0eff', hashtext(scope || E'\n' || key)), migration 007), kept equal so
// that replicas of every version serialize on the same lock. Two-int
// advisory locks never collide with the one-bigint locks used elsewhere
// (migrations, tests).
const lockClass = 0x0eff

// Policy maps event-type classes to how long their dedup rows are kept,
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
//
// Two operator records are kept by age alone, each "permanent" or a Go
// duration: KeepAdminAudit, the console's audit of operator changes
// (onceflow.admin_audit, default DefaultKeepAdminAudit, at least
// MinKeepAdminAudit), and KeepResolvedSetAside, the relay's set-aside rows
// once published or skipped (onceflow.outbox_set_aside, default
// DefaultKeepResolvedSetAside, at least MinKeepResolvedSetAside).
type Policy struct {
	Classes              []Class  `json:"classes"`
	Sources              []Source `json:"sources,omitempty"`
	KeepAdminAudit       string   `json:"keep_admin_audit,omitempty"`
	KeepResolvedSetAside string   `json:"keep_resolved_set_aside,omitempty"`

	// 0: permanent.
	auditTTL, setAsideTTL time.Duration
}

// Defaults and floors of the operator records' retention. The floors are
// also enforced by the database functions that delete them (migration
// console_set_aside), so the consumer's role cannot erase a recent operator
// change.
const (
	// DefaultKeepAdminAudit keeps the audit of operator changes 90 days:
	// long enough for an incident review a quarter later.
	DefaultKeepAdminAudit = 90 * 24 * time.Hour
	MinKeepAdminAudit     = 30 * 24 * time.Hour
	// DefaultKeepResolvedSetAside keeps a resolved set-aside row (with a
	// skipped row's copy and the operator's note) 90 days.
	DefaultKeepResolvedSetAside = 90 * 24 * time.Hour
	MinKeepResolvedSetAside     = 24 * time.Hour
)

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

// Parse reads and checks a retention configuration.
func Parse(data []byte) (*Policy, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var r Policy
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("retention: parse: %w", err)
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// Validate compiles and checks the configuration.
func (r *Policy) Validate() error {
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
	var err error
	if r.auditTTL, err = keepOf("keep_admin_audit", r.KeepAdminAudit, DefaultKeepAdminAudit, MinKeepAdminAudit); err != nil {
		return err
	}
	if r.setAsideTTL, err = keepOf("keep_resolved_set_aside", r.KeepResolvedSetAside, DefaultKeepResolvedSetAside, MinKeepResolvedSetAside); err != nil {
		return err
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

// keepOf parses an operator record's keep: "" is def, "permanent" is 0.
func keepOf(field, v string, def, floor time.Duration) (time.Duration, error) {
	switch v {
	case "":
		return def, nil
	case "permanent":
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < floor {
		return 0, fmt.Errorf("retention: %s %q: want \"permanent\" or a duration of at least %s", field, v, floor)
	}
	return d, nil
}

// AdminAuditTTL is how long audit rows are kept (0: permanent).
func (r *Policy) AdminAuditTTL() time.Duration { return r.auditTTL }

// ResolvedSetAsideTTL is how long resolved set-aside rows are kept (0:
// permanent).
func (r *Policy) ResolvedSetAsideTTL() time.Duration { return r.setAsideTTL }

// ClassOf returns the first class whose glob matches eventType (a source's
// declared type may itself be a glob: it is matched as text).
func (r *Policy) ClassOf(eventType string) (Class, bool) {
	for _, c := range r.Classes {
		if ok, _ := path.Match(c.Match, eventType); ok {
			return c, true
		}
	}
	return Class{}, false
}

// ttlOf returns the TTL of eventType's class, or 0 when it is kept.
func (r *Policy) ttlOf(eventType string) time.Duration {
	c, ok := r.ClassOf(eventType)
	if !ok || c.permanent {
		return 0
	}
	return c.ttl
}

// maxTTL is the longest TTL of a class that is not permanent (0: none).
func (r *Policy) maxTTL() time.Duration {
	var m time.Duration
	for _, c := range r.Classes {
		if !c.permanent {
			m = max(m, c.ttl)
		}
	}
	return m
}

func (r *Policy) minTTL() time.Duration {
	var m time.Duration
	for _, c := range r.Classes {
		if !c.permanent && (m == 0 || c.ttl < m) {
			m = c.ttl
		}
	}
	return m
}

// DefaultConsumer is the logical consumer Prune prunes when
// Options.Consumer is empty (the consumer's own default name).
const DefaultConsumer = "default"

// The defaults Prune uses for zero Options (and the prune command's flags).
const (
	DefaultBatchSize = 500
	DefaultPause     = 20 * time.Millisecond
)

// ConfigError names the Options field that is invalid.
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("retention options: %s %s", e.Field, e.Reason)
}

// Validate reports an invalid field of o as it is (Prune fills zero fields
// with their defaults first): a binary whose flags start at the defaults
// refuses an explicit zero BatchSize or empty Consumer with it. A Pause of
// zero or less is the default.
func (o Options) Validate() error {
	switch {
	case o.BatchSize < 1:
		return &ConfigError{Field: "BatchSize", Reason: fmt.Sprintf("must be at least 1, got %d", o.BatchSize)}
	case o.Consumer == "":
		return &ConfigError{Field: "Consumer", Reason: "must not be empty"}
	}
	return nil
}

// Options bound the work of one statement.
type Options struct {
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

// Stats counts what one Prune removed.
type Stats struct {
	Inbox, Effects, Outbox int64
	// AdminAudit and SetAside count rows of onceflow.admin_audit and
	// onceflow.outbox_set_aside.
	AdminAudit, SetAside int64
	// InboxBuckets counts the inbox's time-bucket partitions removed whole
	// (their rows are counted in Inbox: the planner's estimate of an
	// analyzed bucket, see inbox.BucketRows); BucketsBusy the expired ones
	// left for the next pass because their lock was not had in time.
	InboxBuckets, BucketsBusy int
	// BucketsSealed counts the inbox's time buckets sealed, their ids'
	// filter stored (inbox.SealBucket, inbox.BuildFilter): the dedup
	// probe of an id without a time skips a sealed bucket whose filter
	// does not hold it.
	BucketsSealed int
	// EffectsBuckets counts the effects ledger's time-bucket partitions
	// removed whole (their rows, but those kept, are counted in Effects:
	// the planner's estimate of an analyzed bucket, see
	// effects.BucketRows); EffectsKept the rows moved out of them into the
	// legacy partition (intents, held effects, rows without an event, done
	// effects whose event still has an inbox row). An expired effects
	// bucket whose lock was not had in time counts in BucketsBusy.
	EffectsBuckets int
	EffectsKept    int64
	// Skipped is true when another replica held the pruning lock.
	Skipped bool
	// OutboxNotPermitted is true when the database role may not delete
	// from onceflow.outbox (the consumer's least-privilege role in
	// deploy/sql/roles.sql): published rows were left to the relay, which
	// prunes them after its -retention anyway.
	OutboxNotPermitted bool
}

// qMayPruneOutbox reports whether the session's role may scan and delete
// published outbox rows: read the publish log and the queue, delete rows.
const qMayPruneOutbox = `
SELECT has_table_privilege('onceflow.outbox', 'SELECT') AND has_table_privilege('onceflow.outbox', 'DELETE')
   AND has_table_privilege('onceflow.outbox_published', 'SELECT') AND has_table_privilege('onceflow.outbox_pending', 'SELECT')`

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
//   - onceflow.outbox rows already published, by the time of their batch
//     in the publish log (onceflow.outbox_published);
//   - onceflow.admin_audit rows of o.Consumer older than the policy's
//     AdminAuditTTL, and onceflow.outbox_set_aside rows resolved longer ago
//     than its ResolvedSetAsideTTL (every consumer's pruner may delete
//     these: they are not per consumer), by the database's clock whatever
//     o.Now says, through onceflow.prune_admin_audit (qPruneAudit) and
//     admin.PruneSetAside.
//
// Who prunes published outbox rows: the relay, always, once they are older
// than its retention (relay.Config.Retention, `relay -retention`), whatever
// their class; Prune may delete them sooner, when their class's TTL is
// shorter and its role may delete outbox rows (else it leaves them and sets
// Stats.OutboxNotPermitted). A permanent class therefore protects inbox and effects rows, never
// outbox rows: the outbox is a queue, the inbox is the dedup record. The
// statements are each table's own package's: inbox.ScanProcessed and
// inbox.DeleteProcessed, effects.DeleteDone, admin.ScanPublished and
// admin.DeletePublished.
//
// Only one replica prunes a consumer at a time (a try-lock: a second Prune
// returns Skipped). onceflow.seq_state is never touched: a redelivery of a pruned
// event of a tracked source is still caught by the sequence guard as late.
func Prune(ctx context.Context, db *pgxpool.Pool, r *Policy, o Options) (Stats, error) {
	var st Stats
	if o.BatchSize <= 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.Pause <= 0 {
		o.Pause = DefaultPause
	}
	if o.Consumer == "" {
		o.Consumer = DefaultConsumer
	}
	minTTL := r.minTTL()
	conn, err := db.Acquire(ctx)
	if err != nil {
		return st, err
	}
	defer conn.Release()
	// The classes choose the lane of a type met for the first time
	// (docs/consumer.md, "Storage layout"): published even when every class
	// is permanent.
	if err := inbox.PublishClasses(ctx, conn, o.Consumer, r.inboxClasses()); err != nil {
		return st, fmt.Errorf("retention: %w", err)
	}
	if minTTL == 0 && r.auditTTL == 0 && r.setAsideTTL == 0 {
		return st, nil // everything permanent
	}
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
	p := pass{policy: r, now: now, minTTL: minTTL, batch: o.BatchSize, pause: o.Pause}
	// The operator records, by age (first: they need no access to the
	// outbox or the inbox, only the two functions).
	if r.auditTTL > 0 {
		err := batches(ctx, &p, &st.AdminAudit, func(ctx context.Context) (int64, error) {
			return pruneAudit(ctx, conn, o.Consumer, r.auditTTL, p.batch)
		})
		if err != nil {
			return st, fmt.Errorf("retention: %w", err)
		}
	}
	if r.setAsideTTL > 0 {
		err := batches(ctx, &p, &st.SetAside, func(ctx context.Context) (int64, error) {
			return admin.PruneSetAside(ctx, conn, r.setAsideTTL, p.batch)
		})
		if err != nil {
			return st, fmt.Errorf("retention: %w", err)
		}
	}
	if minTTL > 0 {
		if err := pruneEvents(ctx, conn, &p, o.Consumer, &st); err != nil {
			return st, fmt.Errorf("retention: %w", err)
		}
	}
	return st, nil
}

// qPruneAudit deletes at most $3 finished audit rows of consumer $1 made
// more than $2 (an interval) ago. The console (internal/admin) writes the
// table; this function (migration console_set_aside) is its only delete: it
// runs with its owner's rights, since the consumer's role may not delete
// audit rows, and refuses a keep under 30 days (SQLSTATE 42501).
const qPruneAudit = `SELECT onceflow.prune_admin_audit($1, $2::interval, $3)`

func pruneAudit(ctx context.Context, conn *pgxpool.Conn, consumer string, keep time.Duration, limit int) (int64, error) {
	var n int64
	if err := conn.QueryRow(ctx, qPruneAudit, consumer, keep, limit).Scan(&n); err != nil {
		return 0, fmt.Errorf("prune audit: %w", err)
	}
	return n, nil
}

// batches calls del, which deletes at most p.batch rows, until it deletes
// fewer, pausing p.pause between calls, and adds what it deleted to n.
func batches(ctx context.Context, p *pass, n *int64, del func(ctx context.Context) (int64, error)) error {
	for {
		d, err := del(ctx)
		*n += d
		if err != nil || d < int64(p.batch) {
			return err
		}
		t := time.NewTimer(p.pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// pruneEvents deletes the expired inbox, effects and published outbox rows
// (the event classes' TTLs).
func pruneEvents(ctx context.Context, conn *pgxpool.Conn, p *pass, consumer string, st *Stats) error {
	// The consumer's expired inbox buckets, whole; then, row by row, the
	// partitions that are not buckets; and the effects of the pruned events.
	scopePrefix := effects.ConsumerScopePrefix(consumer)
	if err := pruneBuckets(ctx, conn, p, consumer, st); err != nil {
		return err
	}
	for _, part := range inbox.RowPartitions {
		err := keyset(ctx, p,
			func(ctx context.Context, before, afterAt time.Time, afterID string) ([]candidate[string], error) {
				rows, err := inbox.ScanProcessed(ctx, conn, part, consumer, before, afterAt, afterID, p.batch)
				out := make([]candidate[string], len(rows))
				for i, r := range rows {
					out[i] = candidate[string]{key: r.EventID, eventType: r.EventType, at: r.ReceivedAt}
				}
				return out, err
			},
			func(ctx context.Context, ids []string) error {
				n, err := inbox.DeleteProcessed(ctx, conn, part, consumer, ids)
				if err != nil {
					return err
				}
				st.Inbox += n
				n, err = effects.DeleteDone(ctx, conn, scopePrefix, ids)
				st.Effects += n
				return err
			})
		if err != nil {
			return err
		}
	}

	// The consumer's expired effects buckets, whole (after the inbox rows:
	// a done effect whose event's inbox row is still there is kept).
	if err := pruneEffectBuckets(ctx, conn, p, consumer, st); err != nil {
		return err
	}

	// Published outbox rows, when this role may delete them.
	var may bool
	if err := conn.QueryRow(ctx, qMayPruneOutbox).Scan(&may); err != nil {
		return fmt.Errorf("outbox privileges: %w", err)
	}
	if !may {
		st.OutboxNotPermitted = true
		return nil
	}
	err := keyset(ctx, p,
		func(ctx context.Context, before, afterAt time.Time, afterID int64) ([]candidate[int64], error) {
			rows, err := admin.ScanPublished(ctx, conn, before, afterAt, afterID, p.batch)
			out := make([]candidate[int64], len(rows))
			for i, r := range rows {
				out[i] = candidate[int64]{key: r.ID, eventType: r.EventType, at: r.PublishedAt}
			}
			return out, err
		},
		func(ctx context.Context, ids []int64) error {
			n, err := admin.DeletePublished(ctx, conn, ids)
			st.Outbox += n
			return err
		})
	return err
}

// pass is one pruning pass's settings.
type pass struct {
	policy *Policy
	now    time.Time
	minTTL time.Duration
	batch  int
	pause  time.Duration
}

// candidate is a row a keyset walk reads: its key, its event type (for its
// class) and the time its TTL runs from.
type candidate[K any] struct {
	key       K
	eventType string
	at        time.Time
}

// keyset walks a table in (at, key) order, batch by batch, over the rows
// older than the shortest TTL, and deletes those whose own class's TTL has
// passed. scan returns at most p.batch rows after the cursor; del deletes
// keys. It pauses p.pause between batches.
func keyset[K any](ctx context.Context, p *pass,
	scan func(ctx context.Context, before, afterAt time.Time, after K) ([]candidate[K], error),
	del func(ctx context.Context, keys []K) error,
) error {
	var (
		afterAt time.Time
		after   K
	)
	for {
		rows, err := scan(ctx, p.now.Add(-p.minTTL), afterAt, after)
		if err != nil {
			return err
		}
		var expired []K
		for _, r := range rows {
			afterAt, after = r.at, r.key
			if ttl := p.policy.ttlOf(r.eventType); ttl > 0 && r.at.Before(p.now.Add(-ttl)) {
				expired = append(expired, r.key)
			}
		}
		if len(expired) > 0 {
			if err := del(ctx, expired); err != nil {
				return err
			}
		}
		if len(rows) < p.batch {
			return nil
		}
		t := time.NewTimer(p.pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
