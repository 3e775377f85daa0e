package inbox

import (
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	processed     prometheus.Counter
	duplicates    prometheus.Counter
	deadLettered  prometheus.Counter
	handlerErrors prometheus.Counter
	malformed     prometheus.Counter
	batchSize     prometheus.Histogram
	batchDuration prometheus.Histogram
	lag           *prometheus.GaugeVec
	inFlight      prometheus.Gauge

	// Offsets and assignments.
	offsetsIgnored  *prometheus.CounterVec
	staleBatches    prometheus.Counter
	topicsRecreated prometheus.Counter

	// Sequence guard. The totals count what this process committed; the
	// gauges are read from Postgres by the gap timer, so every replica
	// reports the same values (alert on max, not sum).
	parked      prometheus.Counter
	late        prometheus.Counter
	held        prometheus.Counter
	gapsOpened  prometheus.Counter
	gapsGivenUp prometheus.Counter
	gapsOpen    prometheus.Gauge
	oldestGap   prometheus.Gauge
	parkedNow   prometheus.Gauge
	heldNow     prometheus.Gauge

	// Effects held for an operator (effects.StatusHeld), ledger-wide.
	effectsHeld        prometheus.Gauge
	effectsHeldByScope *prometheus.GaugeVec

	// The sealed buckets' filters this process holds (sealed.go).
	sealedFilterBytes prometheus.Gauge
	sealedUnloaded    prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "onceflow", "consumer"
	m := &metrics{
		processed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "processed_total",
			Help: "Events applied (handler ran and committed)."}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "duplicates_total",
			Help: "Deliveries skipped because the inbox already had the event."}),
		deadLettered: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "dead_lettered_total",
			Help: "Events dead-lettered after failing handler retries or being malformed."}),
		handlerErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "handler_errors_total",
			Help: "Handler failures, counting every failed try."}),
		malformed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "malformed_total",
			Help: "Records that broke the envelope contract (also counted as dead-lettered)."}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "batch_records",
			Help:    "Records per partition batch applied in one transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 7)}),
		batchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "batch_duration_seconds",
			Help:    "Time to apply one partition batch, Postgres and Kafka commits included.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 8)}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "lag_records",
			Help: "Records behind the high watermark per assigned partition, after the last applied batch."},
			[]string{"topic", "partition"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "in_flight_batches",
			Help: "Partition batches being applied right now."}),
		offsetsIgnored: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "stored_offsets_ignored_total",
			Help: "Next offsets stored in Postgres not used for a seek because they do not name the topic's current ID (reason: other_topic_id, no_topic_id, topic_id_unknown)."},
			[]string{"reason"}),
		staleBatches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "stale_batches_dropped_total",
			Help: "Polled batches dropped because their partition was revoked or reassigned since the poll."}),
		topicsRecreated: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "topics_recreated_total",
			Help: "Topics found deleted and recreated while consumed (purged and subscribed again)."}),

		parked: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "parked_total",
			Help: "Events parked behind a sequence gap."}),
		late: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "late_events_total",
			Help: "Events applied marked late (they arrived after their sequence gap was given up)."}),
		held: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "held_total",
			Help: "Late events (or seq conflicts) held for an operator instead of applied."}),
		gapsOpened: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "seq_gaps_opened_total",
			Help: "Sequence gaps opened."}),
		gapsGivenUp: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "seq_gaps_given_up_total",
			Help: "Sequence gaps given up (timeout or parked bound): the events after them were applied without the missing ones."}),
		gapsOpen: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "seq_gaps_open",
			Help: "Sequence gaps open now (this logical consumer, all replicas)."}),
		oldestGap: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "seq_oldest_open_gap_age_seconds",
			Help: "Age of the oldest open sequence gap (0 when none is open)."}),
		parkedNow: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "parked_events",
			Help: "Events parked behind a sequence gap now."}),
		heldNow: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "held_events",
			Help: "Events held for an operator now."}),
		effectsHeld: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "effects_held",
			Help: "External effects held for an operator now (onceflow.effects status held, every scope of the database): a retry came after its downstream's idempotency window."}),
		effectsHeldByScope: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "effects_held_by_scope",
			Help: "External effects held for an operator now, per effects scope (the 50 scopes with the most)."},
			[]string{"scope"}),
		sealedFilterBytes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "sealed_filter_bytes",
			Help: "Bytes of the inbox's sealed-bucket filters this process holds (at most -sealed-filter-max-bytes)."}),
		sealedUnloaded: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "sealed_buckets_unloaded",
			Help: "Sealed inbox buckets whose filters did not fit in -sealed-filter-max-bytes: the dedup probe of an id without a time reads them as if not sealed."}),
	}
	for _, r := range []string{"other_topic_id", "no_topic_id", "topic_id_unknown"} {
		m.offsetsIgnored.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.processed, m.duplicates, m.deadLettered, m.handlerErrors, m.malformed,
		m.batchSize, m.batchDuration, m.lag, m.inFlight, m.offsetsIgnored, m.staleBatches, m.topicsRecreated,
		m.parked, m.late, m.held, m.gapsOpened, m.gapsGivenUp,
		m.gapsOpen, m.oldestGap, m.parkedNow, m.heldNow, m.effectsHeld, m.effectsHeldByScope,
		m.sealedFilterBytes, m.sealedUnloaded} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return m, nil
}

func (m *metrics) setLag(topic string, partition int32, lag int64) {
	if lag < 0 {
		lag = 0
	}
	m.lag.WithLabelValues(topic, strconv.Itoa(int(partition))).Set(float64(lag))
}

func (m *metrics) dropLag(topic string, partition int32) {
	m.lag.DeleteLabelValues(topic, strconv.Itoa(int(partition)))
}

// addGuard adds committed guard decisions to the totals.
func (m *metrics) addGuard(g guardSteps) {
	m.parked.Add(float64(g.counts.Parked))
	m.late.Add(float64(g.counts.Late))
	m.held.Add(float64(g.counts.Held))
	m.gapsOpened.Add(float64(g.counts.GapsOpened))
	m.gapsGivenUp.Add(float64(g.counts.GapsGivenUp))
}
