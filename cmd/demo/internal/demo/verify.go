package demo

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/onceflow/onceflow/internal/audit"
)

// verify checks the invariants against the database.
func (r *run) verify(ctx context.Context) (*Summary, error) {
	s := &Summary{Written: r.written.Load(), RolledBack: r.rolledBack.Load(), Foreign: r.foreign.Load(),
		DuplicatesInjected: r.dupsIn.Load(), Restarts: int(r.restarts.Load())}
	if err := r.pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM onceflow.outbox WHERE id NOT IN (SELECT id FROM onceflow.outbox_pending)),
		(SELECT count(*) FROM public.demo_effects)`).Scan(&s.Published, &s.Applied); err != nil {
		return nil, fmt.Errorf("read totals: %w", err)
	}

	// Effects once: every written event applied exactly once, nothing else;
	// each source in seq order in the order of application (late events
	// excepted).
	applied := audit.NewSequence()
	rows, err := r.pool.Query(ctx, `SELECT event_id, source, seq, late FROM public.demo_effects ORDER BY n`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id, src string
		var seq int64
		var late bool
		if err := rows.Scan(&id, &src, &seq, &late); err != nil {
			return nil, err
		}
		if late {
			applied.Count[id]++
			continue
		}
		applied.Add(id, src, seq)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	written := map[string]bool{}
	r.writtenIDs.Range(func(k, _ any) bool {
		written[k.(string)] = true
		return true
	})
	lost, doubled, unknown := applied.Diff(written)
	for i, id := range doubled {
		doubled[i] = fmt.Sprintf("%s×%d", id, applied.Count[id])
	}
	add := func(name string, ids []string) {
		if len(ids) > 0 {
			sort.Strings(ids)
			s.Violations = append(s.Violations, fmt.Sprintf("%s: %d events, e.g. %s", name, len(ids), strings.Join(first(ids, 5), ", ")))
		}
	}
	add("C1 effects once: lost", lost)
	add("C1 effects once: applied more than once", doubled)
	add("C1 effects once: applied but never committed (rolled back?)", unknown)

	// Duplicates suppressed: each injected copy's event still has one effect.
	r.dupIDs.Range(func(k, _ any) bool {
		s.DuplicateEvents++
		if applied.Count[k.(string)] == 1 {
			s.DuplicatesSuppressed++
		}
		return true
	})
	add("C3 ordered per source: out of order", applied.OutOfOrder)

	// The never-filled gap must have been given up, loudly.
	gaps, err := r.pool.Query(ctx, `SELECT source, from_seq, to_seq FROM onceflow.seq_gaps WHERE state = 'given_up' ORDER BY id`)
	if err != nil {
		return nil, err
	}
	for gaps.Next() {
		var src string
		var from, to int64
		if err := gaps.Scan(&src, &from, &to); err != nil {
			return nil, err
		}
		s.GivenUpGaps = append(s.GivenUpGaps, fmt.Sprintf("%s seq %d–%d", src, from, to))
	}
	if err := gaps.Err(); err != nil {
		return nil, err
	}
	filled, err := r.pool.Query(ctx, `SELECT source, from_seq, to_seq FROM onceflow.seq_gaps WHERE state = 'filled' ORDER BY id`)
	if err != nil {
		return nil, err
	}
	for filled.Next() {
		var src string
		var from, to int64
		if err := filled.Scan(&src, &from, &to); err != nil {
			return nil, err
		}
		s.FilledGaps = append(s.FilledGaps, fmt.Sprintf("%s seq %d–%d", src, from, to))
	}
	if err := filled.Err(); err != nil {
		return nil, err
	}
	s.AlertLine = r.alertLine()
	s.Traces = r.exampleTraces(ctx)
	if r.cfg.Chaos && len(s.GivenUpGaps) == 0 {
		s.Violations = append(s.Violations, "C4 gaps are loud: the never-filled gap of "+gapSource+" was not given up")
	}
	return s, nil
}

func first(ids []string, n int) []string {
	if len(ids) > n {
		return ids[:n]
	}
	return ids
}

func (r *run) report(s *Summary) {
	r.printf("\n== summary\n")
	r.printf("  events written (committed)       %d through the outbox, %d straight to Kafka by a foreign producer\n", s.Written, s.Foreign)
	r.printf("  events rolled back (never sent)  %d\n", s.RolledBack)
	r.printf("  published by the relay           %d\n", s.Published)
	r.printf("  side effects executed            %d\n", s.Applied)
	r.printf("  duplicate copies injected        %d (of %d events; %d of them still applied exactly once)\n",
		s.DuplicatesInjected, s.DuplicateEvents, s.DuplicatesSuppressed)
	r.printf("  relays and consumers SIGKILLed   %d (all restarted)\n", s.Restarts)
	for _, g := range s.FilledGaps {
		r.printf("  gap filled in time (parked, then applied in order, no alert) %s\n", g)
	}
	for _, g := range s.GivenUpGaps {
		r.printf("  gap given up (on-call alerted)   %s\n", g)
	}
	if s.AlertLine != "" {
		r.printf("  the consumer's alert line:\n    %s\n", s.AlertLine)
	}
	if len(s.Traces) > 0 {
		r.printf("\n== example traces (open them in the UI of the OTLP endpoint)\n")
		for _, tr := range s.Traces {
			r.printf("  %-28s trace %s  %s\n", tr.Case, tr.TraceID, tr.Look)
		}
	}
	if s.OK() {
		r.printf("\nOK: side effects executed (%d) == events written (%d), no duplicate applied, every source in seq order.\n", s.Applied, s.Written+s.Foreign)
		return
	}
	r.printf("\nFAILED:\n")
	for _, v := range s.Violations {
		r.printf("  - %s\n", v)
	}
}

// alertLine is the consumer's ERROR log line for a given-up gap, if any.
func (r *run) alertLine() string {
	logs, _ := filepath.Glob(filepath.Join(r.logDir, "consumer-*.log"))
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, `"level":"ERROR"`) && strings.Contains(line, "gap given up") {
				return line
			}
		}
	}
	return ""
}
