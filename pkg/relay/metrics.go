package relay

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Error kinds of onceflow_relay_errors_total.
const (
	errKindCheckpoint = "checkpoint"
	errKindKafka      = "kafka"
	errKindLease      = "lease"
	errKindPostgres   = "postgres"
	errKindTopic      = "topic"
	errKindUnknown    = "unknown_outcome"
	errKindSplit      = "split_transaction"
)

type metrics struct {
	pending     prometheus.Gauge
	oldestAge   prometheus.Gauge
	published   prometheus.Counter
	batchSize   prometheus.Histogram
	txnDuration prometheus.Histogram
	errors      *prometheus.CounterVec
	isLeader    prometheus.Gauge
	pruned      prometheus.Counter
	setAside    prometheus.Gauge
	held        prometheus.Gauge
	setAsideAll *prometheus.CounterVec
	leaderless  prometheus.Gauge

	layoutConflict prometheus.Gauge
	unqueued       prometheus.Counter
	sweepDuration  prometheus.Histogram
	scanFloor      prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "onceflow_relay_pending_rows",
			Help: "Unpublished outbox rows, as last counted by the leader.",
		}),
		oldestAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "onceflow_relay_oldest_unpublished_age_seconds",
			Help: "Age of the oldest unpublished outbox row the relay may publish (not held behind a set-aside row), as last measured by the leader (0 when none).",
		}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceflow_relay_published_total",
			Help: "Outbox rows published in committed Kafka transactions.",
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "onceflow_relay_batch_size",
			Help:    "Rows per Kafka transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 8),
		}),
		txnDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "onceflow_relay_transaction_duration_seconds",
			Help:    "Duration of a Kafka transaction, from begin to the end of the commit.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 10),
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_relay_errors_total",
			Help: "Errors by kind: kafka, postgres, topic (a row set aside for its topic, or the topic check failing), unknown_outcome (Kafka commit outcome unknown), split_transaction (Kafka ended a transaction whose outcome was unknown differently in different partitions; each row went by its own record), checkpoint, lease.",
		}, []string{"kind"}),
		isLeader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "onceflow_relay_is_leader",
			Help: "1 while this relay holds its shard's lease and publishes, else 0.",
		}),
		pruned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceflow_relay_pruned_total",
			Help: "Published outbox rows deleted after the retention.",
		}),
		setAside: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "onceflow_relay_set_aside_rows",
			Help: "Outbox rows set aside because Kafka refuses them (open entries of onceflow.outbox_set_aside), as last counted by the leader.",
		}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "onceflow_relay_held_rows",
			Help: "Unpublished outbox rows of sources that have a set-aside row (they wait behind it), as last counted by the leader.",
		}),
		setAsideAll: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "onceflow_relay_set_aside_total",
			Help: "Outbox rows set aside, by reason: too_large, invalid_topic, invalid_record, topic_authorization, topic_missing, topic_contract.",
		}, []string{"reason"}),
		leaderless: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "onceflow_relay_shards_without_leader",
			Help: "Shards of this relay's shard count (-shards) that no relay leads (no live lease), as last counted by a leader; 0 with one shard.",
		}),
		layoutConflict: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "onceflow_relay_layout_conflict",
			Help: "1 while this relay stands by because relays of another layout lead the database (another -shards, or with -shards 1 another -shard name), else 0.",
		}),
		unqueued: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceflow_relay_unqueued_rows_found_total",
			Help: "Committed outbox rows the leader's sweep found neither queued nor published (written while the outbox's triggers did not fire) and queued.",
		}),
		sweepDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "onceflow_relay_sweep_duration_seconds",
			Help:    "Duration of one sweep for unqueued outbox rows.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 3, 10),
		}),
		scanFloor: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "onceflow_relay_scan_floor",
			Help: "The leader's scan floor: the outbox id its poll walks the queue above (0 at the start of a term). It stays behind while a writing transaction is open or a source is held back.",
		}),
	}
	for _, r := range setAsideReasons {
		m.setAsideAll.WithLabelValues(r)
	}
	for _, k := range []string{errKindCheckpoint, errKindKafka, errKindLease, errKindPostgres, errKindTopic, errKindUnknown, errKindSplit} {
		m.errors.WithLabelValues(k)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.pending, m.oldestAge, m.published, m.batchSize, m.txnDuration, m.errors, m.isLeader, m.pruned, m.setAside, m.held, m.setAsideAll, m.leaderless, m.layoutConflict, m.unqueued, m.sweepDuration, m.scanFloor} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
