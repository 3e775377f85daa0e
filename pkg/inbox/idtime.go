package inbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/onceflow/onceflow/pkg/dbtx"
)

// The dedup probe's time bound (migration 036). A row of a lane other than
// legacy whose event id is a UUIDv7 has event_at >= the id's time less
// idTimeSkew (the constraint inbox_id_time holds every row written since
// onceflow.inbox_id_time.since to it), so the probe of such a key reads a
// lane's buckets from that time on, and those that begin before since
// (rows written before the constraint). A row that would break the rule
// (an id made more than idTimeSkew ahead of the database's clock) is
// written to the legacy lane, which every probe reads whole.

// idTimeSkew is how far ahead of the database's clock an id's time may be
// and its row still go to its lane; the constraint inbox_id_time has the
// same interval.
const idTimeSkew = time.Hour

const qIDTimeSince = `SELECT since FROM onceflow.inbox_id_time`

// eventIDTime returns the time a UUIDv7 event id carries (RFC 9562: the
// first 48 bits, Unix milliseconds) and true; false for any other id. An id
// is a UUIDv7 exactly when the constraint inbox_id_time's pattern matches
// it: 36 characters, lower-case hex in the canonical 8-4-4-4-12 groups,
// version digit 7, variant digit 8, 9, a or b.
func eventIDTime(id string) (time.Time, bool) {
	if len(id) != 36 || id[14] != '7' {
		return time.Time{}, false
	}
	switch id[19] {
	case '8', '9', 'a', 'b':
	default:
		return time.Time{}, false
	}
	var ms int64
	for i := 0; i < 36; i++ {
		c := id[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return time.Time{}, false
			}
			continue
		}
		var v byte
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'f':
			v = c - 'a' + 10
		default:
			return time.Time{}, false
		}
		if i < 13 {
			ms = ms<<4 | int64(v)
		}
	}
	return time.UnixMilli(ms), true
}

// probeBound is the earliest event_at a row of key id written since the
// constraint inbox_id_time took effect can have in a lane other than
// legacy: the id's time less idTimeSkew; minus infinity for an id that is
// not a UUIDv7.
func probeBound(id string) pgtype.Timestamptz {
	t, ok := eventIDTime(id)
	if !ok {
		return pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	}
	return pgtype.Timestamptz{Time: t.Add(-idTimeSkew), Valid: true}
}

// idFloor returns the id's time less idTimeSkew, NULL for an id that is not
// a UUIDv7: a row whose floor is after the database's clock goes to the
// legacy lane.
func idFloor(id string) pgtype.Timestamptz {
	t, ok := eventIDTime(id)
	if !ok {
		return pgtype.Timestamptz{}
	}
	return pgtype.Timestamptz{Time: t.Add(-idTimeSkew), Valid: true}
}

// idTimeSince reads when the constraint inbox_id_time took effect, once: it
// never changes.
func (b *laneBook) idTimeSince(ctx context.Context, db dbtx.DB) (pgtype.Timestamptz, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.since.Valid {
		return b.since, nil
	}
	var since pgtype.Timestamptz
	if err := db.QueryRow(ctx, qIDTimeSince).Scan(&since); err != nil {
		return since, fmt.Errorf("inbox: read onceflow.inbox_id_time (migration 036; run `consumer migrate`): %w", err)
	}
	if !since.Valid {
		return since, fmt.Errorf("inbox: onceflow.inbox_id_time.since is NULL")
	}
	b.since = since
	return since, nil
}

// sinceLiteral writes since as a timestamptz constant of a statement, ""
// for minus infinity (every row held to the constraint).
func sinceLiteral(since pgtype.Timestamptz) string {
	switch since.InfinityModifier {
	case pgtype.NegativeInfinity:
		return ""
	case pgtype.Infinity:
		return "'infinity'::timestamptz"
	}
	return timeLiteral(since.Time)
}

// batchFloor is the least of the probe bounds (probeBound) of a batch's
// keys: minus infinity when one key is not a UUIDv7 (or there is none).
// The probe's planner prunes the buckets that end before it.
func batchFloor(ids []string) pgtype.Timestamptz {
	floor := pgtype.Timestamptz{InfinityModifier: pgtype.NegativeInfinity, Valid: true}
	for i, id := range ids {
		b := probeBound(id)
		if b.InfinityModifier == pgtype.NegativeInfinity {
			return b
		}
		if i == 0 || b.Time.Before(floor.Time) {
			floor = b
		}
	}
	return floor
}
