package relay_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/outbox"
)

type bundle struct {
	ctx context.Context
	db  *testkit.DB
}

func setup(t *testing.T) bundle {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	return bundle{ctx: context.Background(), db: testkit.NewDB(t)}
}

func (b bundle) enqueue(t *testing.T, w outbox.Writer, m outbox.Message) (outbox.Result, error) {
	t.Helper()
	var res outbox.Result
	err := pgx.BeginFunc(b.ctx, b.db.Pool, func(tx pgx.Tx) error {
		var err error
		res, err = w.Enqueue(b.ctx, tx, m)
		return err
	})
	return res, err
}

func msg(source string) outbox.Message {
	return outbox.Message{Topic: "orders", Source: source, EventType: "order.created", Payload: []byte(`{"n":1}`)}
}
