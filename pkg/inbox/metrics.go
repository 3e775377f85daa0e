package inbox

import (
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
}

func newMetrics(reg prometheus.Registerer) *metrics {
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
	}
	if reg != nil {
		reg.MustRegister(m.processed, m.duplicates, m.deadLettered, m.handlerErrors, m.malformed,
			m.batchSize, m.batchDuration, m.lag, m.inFlight)
	}
	return m
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
