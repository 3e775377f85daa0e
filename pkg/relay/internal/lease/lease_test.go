package lease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// renewDB answers the renewal statement: it takes delay, then reports rows
// rows changed (0: the lease is no longer this relay's) or err. Nothing else
// is expected of it.
type renewDB struct {
	delay time.Duration
	rows  int
	err   error
	calls int
}

func (d *renewDB) Exec(ctx context.Context, _ string, _ ...any) (pgconn.CommandTag, error) {
	d.calls++
	select {
	case <-time.After(d.delay):
	case <-ctx.Done():
		return pgconn.CommandTag{}, ctx.Err()
	}
	if d.err != nil {
		return pgconn.CommandTag{}, d.err
	}
	if d.rows == 0 {
		return pgconn.NewCommandTag("UPDATE 0"), nil
	}
	return pgconn.NewCommandTag("UPDATE 1"), nil
}

func (d *renewDB) Begin(context.Context) (pgx.Tx, error) { return nil, errors.New("not expected") }
func (d *renewDB) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errors.New("not expected")
}
func (d *renewDB) QueryRow(context.Context, string, ...any) pgx.Row { return nil }

// The deadline is measured from before the renewal's statement, so a slow
// statement shortens what is left instead of stretching the lease past the
// database's: after a renewal that took 120 ms with a TTL of 1 s, at most
// 880 ms remain. A renewal that changes no row (another relay took the
// lease, or it expired in the database) and one that fails leave the
// deadline where it was. No database is involved: this runs under -short.
func TestLeaseDeadlineFromBeforeTheStatement(t *testing.T) {
	t.Parallel()
	db := &renewDB{delay: 120 * time.Millisecond, rows: 1}
	l := New(Config{DB: db, Shard: "default", Shards: 1, Holder: "h", TTL: time.Second})
	if l.Valid() || l.Remaining() > 0 {
		t.Fatalf("a lease never taken is valid (remaining %s)", l.Remaining())
	}
	held, err := l.Renew(context.Background(), 1, time.Second)
	if err != nil || !held {
		t.Fatalf("renew: held %v, err %v", held, err)
	}
	if r := l.Remaining(); r > time.Second-db.delay || r <= 0 {
		t.Fatalf("remaining %s after a renewal that took %s with a TTL of 1s, want at most %s", r, db.delay, time.Second-db.delay)
	}
	if !l.Valid() {
		t.Fatal("not valid right after a renewal")
	}
	before := l.Remaining()
	db.rows = 0
	if held, err := l.Renew(context.Background(), 1, time.Second); err != nil || held {
		t.Fatalf("renew that changed no row: held %v, err %v", held, err)
	}
	if r := l.Remaining(); r >= before {
		t.Fatalf("a renewal that changed no row extended the lease: %s, was %s", r, before)
	}
	db.rows, db.err = 1, errors.New("connection refused")
	if held, err := l.Renew(context.Background(), 1, time.Second); err == nil || held {
		t.Fatalf("failed renewal: held %v, err %v", held, err)
	}
	if r := l.Remaining(); r >= before {
		t.Fatalf("a failed renewal extended the lease: %s, was %s", r, before)
	}
	// A renewal waits at most its wait: the statement is cancelled, the
	// lease not extended.
	db.err, db.delay = nil, time.Hour
	if held, err := l.Renew(context.Background(), 1, 20*time.Millisecond); err == nil || held {
		t.Fatalf("renewal past its wait: held %v, err %v", held, err)
	}
}

func TestOthers(t *testing.T) {
	t.Parallel()
	ls := Others{{Shard: "0", Shards: 2, Holder: "a", Live: false}, {Shard: "1", Shards: 2, Holder: "b", Live: true}}
	if !ls.Live() || (Others{{Shard: "0", Shards: 2}}).Live() {
		t.Fatal("Live")
	}
	if !ls.SameCount(2) || ls.SameCount(3) {
		t.Fatal("SameCount")
	}
	if got, want := ls.String(), `shard "0" of 2 (expired), shard "1" of 2 (held by b)`; got != want {
		t.Fatalf("String %q, want %q", got, want)
	}
}
