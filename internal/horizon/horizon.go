// Package horizon measures what holds back PostgreSQL's cleanup in the
// database a binary uses: the oldest snapshot of an open transaction, a
// prepared transaction, a standby's hot_standby_feedback, a replication
// slot. While one of them holds the xmin horizon, vacuum cannot remove the
// dead rows that the relay's queue, the inbox and the publish log leave
// behind, and every scan walks them. The binaries register a Collector
// (docs/runbooks/CleanupHeldBack.md).
package horizon

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
)

// Querier is what the Collector needs of a PostgreSQL handle.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Holder kinds, the values of the "holder" label.
const (
	Transaction     = "transaction"      // a session's snapshot (xact_start known)
	Prepared        = "prepared"         // a prepared transaction (its prepare time known)
	Standby         = "standby"          // a walsender's xmin (hot_standby_feedback)
	ReplicationSlot = "replication_slot" // a slot's xmin or catalog_xmin
)

// Holders is every holder kind, in the order the gauges report them.
var Holders = []string{Transaction, Prepared, Standby, ReplicationSlot}

// qHolders finds, per kind, the oldest holder of the horizon that concerns
// this database: sessions and prepared transactions in it, and the
// cluster's walsenders and slots (a logical slot counts for its database
// only). Seconds are unknown for walsenders and slots; transactions (xids)
// are known for all. A role sees other roles' sessions only with
// pg_read_all_stats (docs/runbooks/CleanupHeldBack.md).
const qHolders = `
WITH h (kind, age_seconds, age_xids) AS (
    SELECT 'transaction', extract(epoch FROM clock_timestamp() - coalesce(a.xact_start, a.query_start)), age(a.backend_xmin)
      FROM pg_stat_activity a
     WHERE a.backend_xmin IS NOT NULL AND a.pid <> pg_backend_pid()
       AND a.backend_type = 'client backend' AND a.datname = current_database()
    UNION ALL
    SELECT 'prepared', extract(epoch FROM clock_timestamp() - p.prepared), age(p.transaction)
      FROM pg_prepared_xacts p WHERE p.database = current_database()
    UNION ALL
    SELECT 'standby', NULL, age(a.backend_xmin)
      FROM pg_stat_activity a WHERE a.backend_type = 'walsender' AND a.backend_xmin IS NOT NULL
    UNION ALL
    SELECT 'replication_slot', NULL, greatest(age(s.xmin), age(s.catalog_xmin))
      FROM pg_replication_slots s
     WHERE (s.xmin IS NOT NULL OR s.catalog_xmin IS NOT NULL)
       AND (s.database IS NULL OR s.database = current_database())
)
SELECT kind, coalesce(max(age_seconds), 0)::float8, coalesce(max(age_xids), 0)::float8 FROM h GROUP BY kind`

// Collector reports, at each scrape, the age of the oldest holder of each
// kind in seconds and in transactions (0 when there is none):
//
//	onceflow_<component>_cleanup_horizon_age_seconds{holder}
//	onceflow_<component>_cleanup_horizon_age_xids{holder}
//	onceflow_<component>_cleanup_horizon_errors_total
type Collector struct {
	db      Querier
	log     *slog.Logger
	timeout time.Duration
	seconds *prometheus.Desc
	xids    *prometheus.Desc
	errors  prometheus.Counter
}

// NewCollector measures the database behind db for component ("relay" or
// "consumer"). log hears a failed measurement (nil: discarded).
func NewCollector(db Querier, component string, log *slog.Logger) *Collector {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ns := "onceflow_" + component
	return &Collector{
		db:      db,
		log:     log,
		timeout: 3 * time.Second,
		seconds: prometheus.NewDesc(ns+"_cleanup_horizon_age_seconds",
			"Age of the oldest snapshot holding back PostgreSQL's cleanup, per holder kind (transaction, prepared; 0: none; unknown for standby and replication_slot, see the _xids gauge).",
			[]string{"holder"}, nil),
		xids: prometheus.NewDesc(ns+"_cleanup_horizon_age_xids",
			"Transactions since the oldest xmin holding back PostgreSQL's cleanup, per holder kind (0: none).",
			[]string{"holder"}, nil),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: ns + "_cleanup_horizon_errors_total",
			Help: "Scrapes whose cleanup-horizon query failed."}),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.seconds
	ch <- c.xids
	c.errors.Describe(ch)
}

// Collect implements prometheus.Collector: one query per scrape.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	defer c.errors.Collect(ch)
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	ages, err := Measure(ctx, c.db)
	if err != nil {
		c.errors.Inc()
		c.log.WarnContext(ctx, "measure the cleanup horizon", slog.Any("error", err))
		return
	}
	for _, k := range Holders {
		a := ages[k]
		if k == Transaction || k == Prepared {
			ch <- prometheus.MustNewConstMetric(c.seconds, prometheus.GaugeValue, a.Seconds, k)
		}
		ch <- prometheus.MustNewConstMetric(c.xids, prometheus.GaugeValue, a.Xids, k)
	}
}

// Age is how old a kind's oldest holder is.
type Age struct {
	Seconds float64 // 0 where unknown
	Xids    float64
}

// Measure reads the oldest holder of each kind; kinds without one are absent.
func Measure(ctx context.Context, db Querier) (map[string]Age, error) {
	rows, err := db.Query(ctx, qHolders)
	if err != nil {
		return nil, err
	}
	out := map[string]Age{}
	for rows.Next() {
		var k string
		var a Age
		if err := rows.Scan(&k, &a.Seconds, &a.Xids); err != nil {
			rows.Close()
			return nil, err
		}
		out[k] = a
	}
	return out, rows.Err()
}
