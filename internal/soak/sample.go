package soak

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// sample is the pipeline's state at one moment. A field is -1 when it
// could not be read (the database was away).
type sample struct {
	T           float64 `json:"t_s"`
	Committed   int64   `json:"committed"`
	OnTopic     int64   `json:"on_topic"`
	Applied     int64   `json:"applied"`
	RelayLag    int64   `json:"relay_lag"`
	ConsumerLag int64   `json:"consumer_lag"`
}

type series struct {
	mu      sync.Mutex
	samples []sample
}

func (s *series) add(x sample) {
	s.mu.Lock()
	s.samples = append(s.samples, x)
	s.mu.Unlock()
}

func (s *series) all() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sample(nil), s.samples...)
}

const sampleEvery = time.Second

// sample records the series every second and prints a progress line
// every ten.
func (r *run) sample(ctx context.Context) {
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	lastLine := time.Now()
	var ac appliedCounter
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		x := sample{T: r.elapsed().Seconds(), Committed: r.led.n.Load(), OnTopic: r.topic.seen.Load(), Applied: -1, RelayLag: -1, ConsumerLag: -1}
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if unpublished, err := r.unpublished(qctx); err == nil {
			if applied, err := ac.count(qctx, r.pool); err == nil {
				x.Applied, x.RelayLag = applied, unpublished
				x.ConsumerLag = max(x.OnTopic-applied, 0)
			}
		}
		cancel()
		r.series.add(x)
		if time.Since(lastLine) >= 10*time.Second {
			lastLine = time.Now()
			r.printf("%s\n", r.progressLine(x))
		}
	}
}

// appliedCounter counts soak.effects without scanning all of it each
// second: rows up to a frozen row number are counted once, and the number is
// moved up to what was the newest row a minute earlier (a consumer
// transaction that inserted a row below it and is still open a minute later
// would be missed by the plot, not by the judge, which scans everything).
type appliedCounter struct {
	frozenN, frozenCount int64
	marks                []appliedMark
}

type appliedMark struct {
	at time.Time
	n  int64
}

func (c *appliedCounter) count(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	now := time.Now()
	for len(c.marks) > 0 && now.Sub(c.marks[0].at) > time.Minute {
		next := c.marks[0].n
		c.marks = c.marks[1:]
		if next <= c.frozenN {
			continue
		}
		var n int64
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM soak.effects WHERE n > $1 AND n <= $2 AND consumer = $3`, c.frozenN, next, consumerID).Scan(&n); err != nil {
			return 0, err
		}
		c.frozenN, c.frozenCount = next, c.frozenCount+n
	}
	var n, maxN int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE consumer = $2), coalesce(max(n), 0) FROM soak.effects WHERE n > $1`, c.frozenN, consumerID).Scan(&n, &maxN); err != nil {
		return 0, err
	}
	c.marks = append(c.marks, appliedMark{now, maxN})
	return c.frozenCount + n, nil
}

func (r *run) progressLine(x sample) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[%5.0fs] committed %d (rolled back %d) | on topic %d | applied %s | lag relay %s consumer %s | faults %s",
		x.T, x.Committed, r.led.rb.Load(), x.OnTopic, orDash(x.Applied), orDash(x.RelayLag), orDash(x.ConsumerLag), r.faultCounts())
	r.topic.mu.Lock()
	dupes, reordered, malformed := len(r.topic.dupes), len(r.topic.reordered), len(r.topic.malformed)
	r.topic.mu.Unlock()
	if dupes+reordered+malformed > 0 {
		fmt.Fprintf(&b, " | ON THE TOPIC SO FAR: %d duplicate, %d reordered, %d malformed", dupes, reordered, malformed)
	}
	if cur := r.current.Load(); cur != nil {
		fmt.Fprintf(&b, " | now: %s", *cur)
	}
	return b.String()
}

func orDash(n int64) string {
	if n < 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

// faultCounts is "N (kind n, …)".
func (r *run) faultCounts() string {
	r.faultsMu.Lock()
	defer r.faultsMu.Unlock()
	by := map[string]int{}
	for _, f := range r.faults {
		by[f.Kind]++
	}
	kinds := make([]string, 0, len(by))
	for k := range by {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool { return kindOrder(kinds[i]) < kindOrder(kinds[j]) })
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s %d", k, by[k])
	}
	if len(parts) == 0 {
		return "0"
	}
	return fmt.Sprintf("%d (%s)", len(r.faults), strings.Join(parts, ", "))
}

func kindOrder(k string) int {
	for i, x := range AllKinds {
		if x == k {
			return i
		}
	}
	return len(AllKinds)
}
