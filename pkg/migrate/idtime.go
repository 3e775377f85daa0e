package migrate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// IDTimeReport is what ValidateIDTime did.
type IDTimeReport struct {
	// Validated are the inbox partitions whose rows were checked now.
	Validated []string
	// Broken are the partitions holding rows the constraint refuses
	// (written before migration 036 by a producer whose ids ran more than
	// an hour ahead of the database's clock); while there is one,
	// onceflow.inbox_id_time.since is left as it was.
	Broken []BrokenPartition
	// Done is true when every row is held to the constraint and since was
	// set to -infinity (now or by an earlier run).
	Done bool
}

// BrokenPartition is an inbox partition with rows that break inbox_id_time.
type BrokenPartition struct {
	Name           string
	Rows           int64
	Oldest, Newest time.Time // the rows' event_at
}

const (
	qIDTimeInstalled = `SELECT to_regclass('onceflow.inbox_id_time') IS NOT NULL`
	// qIDTimeUnchecked lists the inbox's partitions whose copy of the
	// constraint is NOT VALID, the default partition last (a bucket of the
	// range it holds cannot be attached while it is checked).
	qIDTimeUnchecked = `
SELECT r.relname, pg_get_expr(k.conbin, k.conrelid)
  FROM pg_constraint k JOIN pg_class r ON r.oid = k.conrelid
 WHERE k.conname = 'inbox_id_time' AND r.relnamespace = 'onceflow'::regnamespace
   AND r.relkind = 'r' AND NOT k.convalidated
 ORDER BY r.relname = 'inbox_default', r.relname`
	qIDTimeRootValid = `
SELECT convalidated FROM pg_constraint WHERE conname = 'inbox_id_time' AND conrelid = 'onceflow.inbox'::regclass`
	qIDTimeSinceOpen = `UPDATE onceflow.inbox_id_time SET since = '-infinity'`
)

// idTimeLockTimeout bounds each step's wait for its lock; a step that
// times out is tried again with backoff for at most idTimeLockRetry.
const (
	idTimeLockTimeout = "1s"
	idTimeLockRetry   = time.Minute
)

// ValidateIDTime checks the rows written before migration 036 against its
// constraint inbox_id_time, partition by partition, and when every row
// holds sets onceflow.inbox_id_time.since to -infinity: the dedup probe of
// a UUIDv7 key then reads no bucket older than the key's time (it reads
// every bucket that begins before since, for the rows written before the
// constraint). Run it once on a database migrated from before 036, at any
// time; it is idempotent.
//
// Locks: each partition is checked in its own transaction under SHARE
// UPDATE EXCLUSIVE (ALTER TABLE ... VALIDATE CONSTRAINT reads every row of
// the partition), which lets consumers insert and read; retention's
// truncation of that partition and the attaching of a new bucket while the
// default partition is checked wait or fail and retry (they wait at most
// 100 ms, then try again later). The last step validates the constraint on
// onceflow.inbox (every partition checked already: catalog only) and sets
// since in one transaction. A consumer reads since when it starts: restart
// consumers to have them skip the old buckets.
func ValidateIDTime(ctx context.Context, conn *pgx.Conn) (IDTimeReport, error) {
	var rep IDTimeReport
	var ok bool
	if err := conn.QueryRow(ctx, qIDTimeInstalled).Scan(&ok); err != nil {
		return rep, fmt.Errorf("validate inbox_id_time: %w", err)
	}
	if !ok {
		return rep, errors.New("validate inbox_id_time: the database lacks migration 036 (onceflow.inbox_id_time): migrate first")
	}
	type part struct{ name, expr string }
	var parts []part
	rows, err := conn.Query(ctx, qIDTimeUnchecked)
	if err != nil {
		return rep, fmt.Errorf("validate inbox_id_time: list partitions: %w", err)
	}
	for rows.Next() {
		var p part
		if err := rows.Scan(&p.name, &p.expr); err != nil {
			return rep, err
		}
		parts = append(parts, p)
	}
	if err := rows.Err(); err != nil {
		return rep, fmt.Errorf("validate inbox_id_time: list partitions: %w", err)
	}
	for _, p := range parts {
		ident := pgx.Identifier{"onceflow", p.name}.Sanitize()
		err := inTxRetry(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "ALTER TABLE "+ident+" VALIDATE CONSTRAINT inbox_id_time")
			return err
		})
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			rep.Validated = append(rep.Validated, p.name)
		case errors.As(err, &pgErr) && pgErr.Code == "42P01":
			// Dropped by retention meanwhile.
		case errors.As(err, &pgErr) && pgErr.Code == "23514":
			b := BrokenPartition{Name: p.name}
			// The expression is the constraint's own, read from the catalog.
			q := "SELECT count(*), coalesce(min(event_at), 'epoch'), coalesce(max(event_at), 'epoch') FROM " + ident + " WHERE NOT (" + p.expr + ")"
			if err := conn.QueryRow(ctx, q).Scan(&b.Rows, &b.Oldest, &b.Newest); err != nil {
				return rep, fmt.Errorf("validate inbox_id_time: count the rows of %s that break it: %w", p.name, err)
			}
			rep.Broken = append(rep.Broken, b)
		default:
			return rep, fmt.Errorf("validate inbox_id_time on %s: %w", p.name, err)
		}
	}
	if len(rep.Broken) > 0 {
		return rep, nil
	}
	// Every partition checked: the root's flag and since, together.
	err = inTxRetry(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "ALTER TABLE onceflow.inbox VALIDATE CONSTRAINT inbox_id_time"); err != nil {
			return err
		}
		var valid bool
		if err := tx.QueryRow(ctx, qIDTimeRootValid).Scan(&valid); err != nil {
			return err
		}
		if !valid {
			return errors.New("onceflow.inbox's constraint still NOT VALID after VALIDATE")
		}
		_, err := tx.Exec(ctx, qIDTimeSinceOpen)
		return err
	})
	if err != nil {
		return rep, fmt.Errorf("validate inbox_id_time on onceflow.inbox (a bucket attached meanwhile may hold rows that break it: run again): %w", err)
	}
	rep.Done = true
	return rep, nil
}

// inTxRetry runs f in a transaction whose lock waits end after
// idTimeLockTimeout, again with backoff while it fails for a lock wait
// (SQLSTATE 55P03), for at most idTimeLockRetry.
func inTxRetry(ctx context.Context, conn *pgx.Conn, f func(pgx.Tx) error) error {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 100 * time.Millisecond
	bo.MaxElapsedTime = idTimeLockRetry
	return backoff.Retry(func() error {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+idTimeLockTimeout+"'"); err != nil {
				return err
			}
			return f(tx)
		})
		var pgErr *pgconn.PgError
		if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "55P03") {
			return backoff.Permanent(err)
		}
		return err
	}, backoff.WithContext(bo, ctx))
}
