package retention

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/onceflow/onceflow/pkg/inbox"
)

// Metrics are the counters of Run.
type Metrics struct {
	// Pruned counts deleted rows by table (inbox, effects, outbox,
	// admin_audit, outbox_set_aside).
	Pruned *prometheus.CounterVec
	// Runs counts passes by result (ok, skipped, error).
	Runs *prometheus.CounterVec
	// OldestAge is the age of the oldest processed inbox row per retention
	// class (label: the class's glob; "(unclassified)" for types no class
	// matches), refreshed after every pass. A TTL class whose oldest row is
	// much older than its TTL is not being pruned.
	OldestAge *prometheus.GaugeVec
	// Buckets counts the inbox's time buckets by what a pass did to them
	// (removed: expired and dropped whole; sealed: sealed and their ids'
	// filter stored; busy: left for the next pass, their lock not had).
	Buckets *prometheus.CounterVec
}

// Unclassified labels event types that no retention class matches.
const Unclassified = "(unclassified)"

// NewMetrics registers the pruner's counters on reg (nil: not
// registered); registering twice on one registry is an error.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Pruned: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_consumer_retention_pruned_total",
			Help: "Rows deleted by retention pruning, by table."}, []string{"table"}),
		Runs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_consumer_retention_prune_runs_total",
			Help: "Retention pruning passes by result (ok, skipped: another replica held the lock, error)."}, []string{"result"}),
		OldestAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "onceflow_consumer_retention_oldest_row_age_seconds",
			Help: "Age of the oldest processed inbox row per retention class."}, []string{"class"}),
		Buckets: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_consumer_retention_buckets_total",
			Help: "Inbox time buckets by what retention did to them (removed, sealed, busy: left for the next pass)."}, []string{"action"}),
	}
	for _, t := range []string{"inbox", "effects", "outbox", "admin_audit", "outbox_set_aside"} {
		m.Pruned.WithLabelValues(t)
	}
	for _, r := range []string{"ok", "skipped", "error"} {
		m.Runs.WithLabelValues(r)
	}
	for _, a := range []string{"removed", "sealed", "busy"} {
		m.Buckets.WithLabelValues(a)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.Pruned, m.Runs, m.OldestAge, m.Buckets} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register retention metrics: %w", err)
		}
	}
	return m, nil
}

// Run runs Prune every interval (the first pass right away) until ctx
// ends, counting into m. Errors are logged and counted, never fatal.
func Run(ctx context.Context, db *pgxpool.Pool, r *Policy, interval time.Duration, o Options, m *Metrics, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	saidOutbox := false
	for {
		st, err := Prune(ctx, db, r, o)
		if st.OutboxNotPermitted && !saidOutbox {
			saidOutbox = true
			log.InfoContext(ctx, "retention leaves published outbox rows to the relay: this database role may not delete from onceflow.outbox")
		}
		m.Pruned.WithLabelValues("inbox").Add(float64(st.Inbox))
		m.Pruned.WithLabelValues("effects").Add(float64(st.Effects))
		m.Pruned.WithLabelValues("outbox").Add(float64(st.Outbox))
		m.Pruned.WithLabelValues("admin_audit").Add(float64(st.AdminAudit))
		m.Pruned.WithLabelValues("outbox_set_aside").Add(float64(st.SetAside))
		m.Buckets.WithLabelValues("removed").Add(float64(st.InboxBuckets))
		m.Buckets.WithLabelValues("sealed").Add(float64(st.BucketsSealed))
		m.Buckets.WithLabelValues("busy").Add(float64(st.BucketsBusy))
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			m.Runs.WithLabelValues("error").Inc()
			log.WarnContext(ctx, "retention prune", slog.String("error", err.Error()))
		case st.Skipped:
			m.Runs.WithLabelValues("skipped").Inc()
		default:
			m.Runs.WithLabelValues("ok").Inc()
			if st.Inbox+st.Effects+st.Outbox+st.AdminAudit+st.SetAside > 0 || st.BucketsSealed > 0 {
				log.InfoContext(ctx, "retention pruned", slog.Int64("inbox", st.Inbox), slog.Int64("effects", st.Effects), slog.Int64("outbox", st.Outbox),
					slog.Int64("admin_audit", st.AdminAudit), slog.Int64("outbox_set_aside", st.SetAside),
					slog.Int("inbox_buckets", st.InboxBuckets), slog.Int("inbox_buckets_sealed", st.BucketsSealed),
					slog.Int("effects_buckets", st.EffectsBuckets), slog.Int64("effects_kept", st.EffectsKept))
			}
		}
		if ages, err := OldestAgeByClass(ctx, db, r, o.Consumer); err == nil {
			m.OldestAge.Reset()
			for class, age := range ages {
				m.OldestAge.WithLabelValues(class).Set(age.Seconds())
			}
		} else if ctx.Err() == nil {
			log.WarnContext(ctx, "retention: oldest row age", slog.String("error", err.Error()))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// OldestAgeByClass returns, per retention class (its glob, or Unclassified),
// the age of the oldest processed inbox row of consumer (DefaultConsumer
// when empty), from inbox.OldestProcessed (a scan of the consumer's inbox
// rows: run it at the pruning interval, not more often).
func OldestAgeByClass(ctx context.Context, db *pgxpool.Pool, r *Policy, consumer string) (map[string]time.Duration, error) {
	if consumer == "" {
		consumer = DefaultConsumer
	}
	byType, err := inbox.OldestProcessed(ctx, db, consumer)
	if err != nil {
		return nil, err
	}
	ages := map[string]time.Duration{}
	for typ, age := range byType {
		class := Unclassified
		if c, ok := r.ClassOf(typ); ok {
			class = c.Match
		}
		if age > ages[class] {
			ages[class] = age
		}
	}
	return ages, nil
}
