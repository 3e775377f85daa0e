package soak

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/pgtemp"
)

// switchover moves the producing databases from old (the primary) to next
// (its streaming standby), as an operator does for maintenance: old is
// stopped cleanly (its WAL senders pass every record, the shutdown
// checkpoint last, to the standby before it exits), next is promoted only
// once it has replayed that checkpoint, and the proxy the binaries use
// points at it from then on (the soak's own pools find it by
// target_session_attrs). Then old is rebuilt as next's standby. It returns
// how old was rebuilt, when the outage ended (next accepting writes behind
// the proxy) and what went wrong, if anything. When next lacks old's last
// record, old is started again as the primary and nothing is promoted.
func (r *run) switchover(ctx context.Context, old, next *pgtemp.Cluster) (string, time.Time, string) {
	// A standby that does not stream (a rebuild that failed) is rebuilt
	// first; without one, there is no switchover.
	if err := next.WaitStreaming(ctx, 5*time.Second); err != nil {
		_ = next.StopServer(ctx, "immediate")
		if how, err := next.Rebuild(ctx, old); err != nil {
			return "skipped", time.Now(), fmt.Sprintf("the standby does not stream and could not be rebuilt: %v", err)
		} else if err := next.WaitStreaming(ctx, 5*time.Second); err != nil {
			return "skipped", time.Now(), fmt.Sprintf("the standby, rebuilt by %s, does not stream: %v", how, err)
		}
	}
	if err := old.StopServer(ctx, "fast"); err != nil {
		return "", time.Time{}, err.Error()
	}
	lsn, err := old.CheckpointLSN(ctx)
	if err == nil {
		err = waitReplayed(ctx, next, lsn, 30*time.Second)
	}
	if err != nil {
		// Not a clean switchover: the primary comes back instead.
		if serr := old.StartServer(ctx); serr != nil {
			err = fmt.Errorf("%w; start the primary again: %v", err, serr)
		}
		return "aborted, the primary started again", time.Now(), err.Error()
	}
	var errs []string
	if err := next.Promote(ctx); err != nil {
		errs = append(errs, err.Error())
	}
	r.pgProxy.Retarget(fmt.Sprintf("127.0.0.1:%d", next.Port))
	r.pg, r.standby = next, old
	end := time.Now()
	how, err := old.Rebuild(ctx, next)
	if err != nil {
		errs = append(errs, fmt.Sprintf("rebuild the former primary as the standby: %v", err))
	}
	return fmt.Sprintf("standby had %s; the former primary %s in %s", lsn, how, time.Since(end).Round(100*time.Millisecond)),
		end, strings.Join(errs, "; ")
}

// waitReplayed waits until the standby s has replayed WAL up to lsn.
func waitReplayed(ctx context.Context, s *pgtemp.Cluster, lsn string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var at string
	for {
		conn, err := pgx.Connect(ctx, s.URL)
		if err == nil {
			var ok bool
			err = conn.QueryRow(ctx, `SELECT coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false), coalesce(pg_last_wal_replay_lsn()::text, '')`, lsn).Scan(&ok, &at)
			conn.Close(context.WithoutCancel(ctx))
			if err == nil && ok {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the standby replayed up to %q, not the primary's last checkpoint %s, within %s (%v)", at, lsn, limit, err)
		case <-time.After(100 * time.Millisecond): // polling the standby's replay
		}
	}
}
