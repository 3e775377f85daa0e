package outbox

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
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "onceflow_relay_pending_rows",
			Help: "Unpublished outbox rows, as last counted by the leader.",
		}),
		oldestAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "onceflow_relay_oldest_unpublished_age_seconds",
			Help: "Age of the oldest unpublished outbox row, as last measured by the leader (0 when none).",
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
			Help: "Errors by kind: kafka, postgres, topic (missing topic), unknown_outcome (Kafka commit outcome unknown), checkpoint, lease.",
		}, []string{"kind"}),
		isLeader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "onceflow_relay_is_leader",
			Help: "1 while this relay holds its shard's lease and publishes, else 0.",
		}),
		pruned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "onceflow_relay_pruned_total",
			Help: "Published outbox rows deleted after the retention.",
		}),
	}
	for _, k := range []string{errKindCheckpoint, errKindKafka, errKindLease, errKindPostgres, errKindTopic, errKindUnknown} {
		m.errors.WithLabelValues(k)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.pending, m.oldestAge, m.published, m.batchSize, m.txnDuration, m.errors, m.isLeader, m.pruned} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
