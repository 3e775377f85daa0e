package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// WriteText writes the human summary of rep.
func WriteText(w io.Writer, rep *Report) error {
	c := rep.Counts
	win := rep.Window
	var b strings.Builder
	if win.FromID != 0 {
		to := "end"
		if win.ToID != 0 {
			to = fmt.Sprint(win.ToID)
		}
		fmt.Fprintf(&b, "window: outbox ids %d to %s, committed before %s\n", win.FromID, to, stamp(win.Until))
	} else {
		fmt.Fprintf(&b, "window: outbox rows committed %s to %s\n", stamp(win.From), stamp(win.Until))
	}
	if rep.ProducerOnly {
		fmt.Fprintf(&b, "producer %s, topics %s; the relay's side only (no consumer read)\n", rep.Producer, strings.Join(rep.Topics, ","))
		fmt.Fprintf(&b, "read: %d outbox rows (%d still queued), %d records (%d of other producers, not judged; %d malformed); %d streams, at most %d seq ranges held\n",
			c.Committed, c.Queued, c.Records, c.OtherProducers, c.Malformed, c.Streams, c.Ranges)
	} else {
		fmt.Fprintf(&b, "producer %s, topics %s, consumer %q (group %q)\n", rep.Producer, strings.Join(rep.Topics, ","), rep.Consumer, rep.Group)
		fmt.Fprintf(&b, "read: %d outbox rows (%d still queued), %d records (%d of other producers, %d malformed, %d past the stored offsets), "+
			"%d inbox rows (%d applied, %d parked, %d dead or held); %d streams, at most %d seq ranges held\n",
			c.Committed, c.Queued, c.Records, c.OtherProducers, c.Malformed, c.Unconsumed,
			c.Applied+c.Parked+c.Dead, c.Applied, c.Parked, c.Dead, c.Streams, c.Ranges)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	if len(rep.Findings) == 0 {
		_, err := fmt.Fprintln(w, "clean: no anomaly")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tPRODUCER\tTOPIC\tSOURCE\tSEQS\tCOUNT\tDETAIL")
	for _, f := range rep.Findings {
		kind := f.Kind
		if f.Resolved {
			kind += " (resolved)"
		}
		set := &Set{rs: f.Seqs}
		seqs := set.String()
		if int64(len(f.Seqs)) < f.Count && set.Len() < f.Count {
			seqs += ",…"
		}
		producer := f.Producer
		if producer == "" {
			producer = "(legacy)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", kind, producer, f.Topic, f.Source, seqs, f.Count, f.Detail)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	verdict := fmt.Sprintf("%d anomalies\n", rep.Anomalies)
	if rep.Clean() {
		verdict = "clean: no anomaly (only resolved gaps)\n"
	}
	_, err := io.WriteString(w, verdict)
	return err
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

// WriteJSON writes rep as one JSON document.
func WriteJSON(w io.Writer, rep *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// Run summaries (onceflow.reconcile_runs, migration 023).

// LastRun is the latest recorded run of a consumer.
type LastRun struct {
	ID         int64           `json:"id"`
	Consumer   string          `json:"consumer"`
	Topics     []string        `json:"topics"`
	StartedAt  time.Time       `json:"started_at"`
	FinishedAt time.Time       `json:"finished_at"`
	Status     string          `json:"status"`
	Anomalies  int             `json:"anomalies"`
	Report     json.RawMessage `json:"report"`
}

// ErrNoRunsTable means the database lacks migration 023.
var ErrNoRunsTable = errors.New("onceflow.reconcile_runs is missing: run `consumer migrate`")

// Record stores rep's summary in the consumer's database.
func Record(ctx context.Context, pool *pgxpool.Pool, rep *Report) error {
	body, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	status := "clean"
	if !rep.Clean() {
		status = "anomalies"
	}
	_, err = pool.Exec(ctx, qRecordRun, rep.Consumer, rep.Topics, rep.StartedAt, rep.FinishedAt, status, rep.Anomalies, body)
	return runsError(err)
}

// Last returns the latest recorded run of consumer, or nil when there is
// none.
func Last(ctx context.Context, pool *pgxpool.Pool, consumer string) (*LastRun, error) {
	var l LastRun
	err := pool.QueryRow(ctx, qLastRun, consumer).Scan(&l.ID, &l.Consumer, &l.Topics, &l.StartedAt, &l.FinishedAt,
		&l.Status, &l.Anomalies, &l.Report)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, runsError(err)
	}
	return &l, nil
}

func runsError(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" {
		return ErrNoRunsTable
	}
	if err != nil {
		return fmt.Errorf("onceflow.reconcile_runs: %w", err)
	}
	return nil
}
