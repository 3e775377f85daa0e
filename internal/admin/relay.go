package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Lease is a row of onceflow.relay_lease.
type Lease struct {
	Shard string `json:"shard"`
	// Shards is the shard count of the relay holding it (1 unsharded; 0
	// before migration relay_queue, which added it to relay_status()).
	Shards     int       `json:"shards"`
	Holder     string    `json:"holder"`
	Epoch      int64     `json:"epoch"`
	AcquiredAt time.Time `json:"acquired_at"`
	RenewedAt  time.Time `json:"renewed_at"`
	ExpiresAt  time.Time `json:"expires_at"`
	// Live: not expired (by the database clock).
	Live bool `json:"live"`
}

// RelayStatus is the relay's state as the database shows it.
type RelayStatus struct {
	// PendingRows are outbox rows not yet published; the oldest was
	// committed at OldestUnpublishedAt.
	PendingRows                 int64      `json:"pending_rows"`
	OldestUnpublishedAt         *time.Time `json:"oldest_unpublished_at"`
	OldestUnpublishedAgeSeconds float64    `json:"oldest_unpublished_age_seconds"`
	Leases                      []Lease    `json:"leases"`
	// Leader is the holder of a live lease ("" when no relay leads).
	Leader string `json:"leader"`
	// SetAside are the open outbox rows the relay set aside.
	SetAside *SetAside `json:"set_aside"`
	// Self is the answering relay process (relay binary only).
	Self   *RelaySelf `json:"self,omitempty"`
	DBTime time.Time  `json:"db_time"`
}

// RelaySelf is the relay process that answers.
type RelaySelf struct {
	Role string `json:"role"`
}

// SetAside lists the outbox rows the relay set aside because Kafka refused
// them permanently and that are not resolved yet (`relay outbox failed
// list`): while one is open, its source publishes nothing after it.
type SetAside struct {
	// Count is the number of open rows; Rows holds the oldest
	// MaxSetAsideRows of them.
	Count int64         `json:"count"`
	Rows  []SetAsideRow `json:"rows"`
	// Oldest is when the oldest open row was set aside (nil: none).
	Oldest *time.Time `json:"oldest"`
}

// SetAsideRow is one open set-aside outbox row.
type SetAsideRow struct {
	OutboxID  int64  `json:"outbox_id"`
	EventID   string `json:"event_id"`
	Topic     string `json:"topic"`
	Source    string `json:"source"`
	Seq       int64  `json:"seq"`
	EventType string `json:"event_type"`
	// Reason: too_large, invalid_topic, topic_authorization,
	// invalid_record, topic_missing or topic_contract; Error is Kafka's or
	// the client's text.
	Reason       string    `json:"reason"`
	Error        string    `json:"error"`
	Attempts     int       `json:"attempts"`
	SetAsideAt   time.Time `json:"set_aside_at"`
	LastFailedAt time.Time `json:"last_failed_at"`
	// RetryAt is when the relay tries the row again by itself (nil: it
	// waits for an operator).
	RetryAt *time.Time `json:"retry_at"`
}

// MaxSetAsideRows is the most set-aside rows the relay status lists (Count
// counts them all).
const MaxSetAsideRows = 100

// ReadRelayStatus reads the relay's status through onceflow.relay_status(),
// which a role may execute without reading outbox payloads.
func ReadRelayStatus(ctx context.Context, pool *pgxpool.Pool) (RelayStatus, error) {
	var st RelayStatus
	var leases []byte
	if err := pool.QueryRow(ctx, qRelayStatus).Scan(&st.PendingRows, &st.OldestUnpublishedAt, &st.DBTime, &leases); err != nil {
		return st, fmt.Errorf("relay status: %w", err)
	}
	if err := json.Unmarshal(leases, &st.Leases); err != nil {
		return st, fmt.Errorf("relay status: leases: %w", err)
	}
	if st.OldestUnpublishedAt != nil {
		st.OldestUnpublishedAgeSeconds = max(st.DBTime.Sub(*st.OldestUnpublishedAt).Seconds(), 0)
	}
	for _, l := range st.Leases {
		if l.Live {
			st.Leader = l.Holder
		}
	}
	sa, err := setAsideRows(ctx, pool)
	if err != nil {
		return st, err
	}
	st.SetAside = sa
	return st, nil
}

// setAsideRows reads the open set-aside outbox rows through
// onceflow.relay_set_aside(), which the consumer's role may execute without
// reading onceflow.outbox_set_aside itself.
func setAsideRows(ctx context.Context, pool *pgxpool.Pool) (*SetAside, error) {
	rows, err := pool.Query(ctx, qRelaySetAside, MaxSetAsideRows)
	if err != nil {
		return nil, fmt.Errorf("relay set-aside rows: %w", err)
	}
	sa := &SetAside{Rows: []SetAsideRow{}}
	for rows.Next() {
		var r SetAsideRow
		if err := rows.Scan(&r.OutboxID, &r.EventID, &r.Topic, &r.Source, &r.Seq, &r.EventType, &r.Reason, &r.Error,
			&r.Attempts, &r.SetAsideAt, &r.LastFailedAt, &r.RetryAt, &sa.Count); err != nil {
			rows.Close()
			return nil, fmt.Errorf("relay set-aside rows: %w", err)
		}
		sa.Rows = append(sa.Rows, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("relay set-aside rows: %w", err)
	}
	if len(sa.Rows) > 0 {
		sa.Oldest = &sa.Rows[0].SetAsideAt
	}
	return sa, nil
}

// Relay reads the relay's status.
func (s *Service) Relay(ctx context.Context) (RelayStatus, error) {
	return ReadRelayStatus(ctx, s.cfg.Pool)
}
