package effects

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
)

// PrunerMetrics are the counters of RunPruner.
type PrunerMetrics struct {
	// Pruned counts deleted rows by table (inbox, effects, outbox).
	Pruned *prometheus.CounterVec
	// Runs counts passes by result (ok, skipped, error).
	Runs *prometheus.CounterVec
	// OldestAge is the age of the oldest processed inbox row per retention
	// class (label: the class's glob; "(unclassified)" for types no class
	// matches), refreshed after every pass. A TTL class whose oldest row is
	// much older than its TTL is not being pruned.
	OldestAge *prometheus.GaugeVec
}

// Unclassified labels event types that no retention class matches.
const Unclassified = "(unclassified)"

// NewPrunerMetrics registers the pruner's counters on reg (nil: not
// registered).
func NewPrunerMetrics(reg prometheus.Registerer) *PrunerMetrics {
	m := &PrunerMetrics{
		Pruned: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_consumer_retention_pruned_total",
			Help: "Rows deleted by retention pruning, by table."}, []string{"table"}),
		Runs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "onceflow_consumer_retention_prune_runs_total",
			Help: "Retention pruning passes by result (ok, skipped: another replica held the lock, error)."}, []string{"result"}),
		OldestAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "onceflow_consumer_retention_oldest_row_age_seconds",
			Help: "Age of the oldest processed inbox row per retention class."}, []string{"class"}),
	}
	for _, t := range []string{"inbox", "effects", "outbox"} {
		m.Pruned.WithLabelValues(t)
	}
	for _, r := range []string{"ok", "skipped", "error"} {
		m.Runs.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.Pruned, m.Runs, m.OldestAge)
	}
	return m
}

// RunPruner runs Prune every interval (the first pass right away) until ctx
// ends, counting into m. Errors are logged and counted, never fatal.
func RunPruner(ctx context.Context, db *pgxpool.Pool, r *Retention, interval time.Duration, o PruneOptions, m *PrunerMetrics, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		st, err := Prune(ctx, db, r, o)
		m.Pruned.WithLabelValues("inbox").Add(float64(st.Inbox))
		m.Pruned.WithLabelValues("effects").Add(float64(st.Effects))
		m.Pruned.WithLabelValues("outbox").Add(float64(st.Outbox))
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
			if st.Inbox+st.Effects+st.Outbox > 0 {
				log.InfoContext(ctx, "retention pruned", slog.Int64("inbox", st.Inbox), slog.Int64("effects", st.Effects), slog.Int64("outbox", st.Outbox))
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
// when empty). It reads one aggregate over the
// processed inbox rows grouped by event type (a scan of the inbox: run it at
// the pruning interval, not more often).
func OldestAgeByClass(ctx context.Context, db *pgxpool.Pool, r *Retention, consumer string) (map[string]time.Duration, error) {
	if consumer == "" {
		consumer = DefaultConsumer
	}
	rows, err := db.Query(ctx, `SELECT event_type, (extract(epoch FROM now() - min(received_at)) * 1e6)::bigint
		FROM onceflow.inbox WHERE consumer = $1 AND status = 'processed' GROUP BY event_type`, consumer)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	ages := map[string]time.Duration{}
	for rows.Next() {
		var typ string
		var micros int64
		if err := rows.Scan(&typ, &micros); err != nil {
			return nil, err
		}
		class := Unclassified
		if c, ok := r.ClassOf(typ); ok {
			class = c.Match
		}
		if age := time.Duration(micros) * time.Microsecond; age > ages[class] {
			ages[class] = age
		}
	}
	return ages, rows.Err()
}
