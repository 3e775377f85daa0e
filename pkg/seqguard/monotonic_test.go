package seqguard_test

import (
	"context"
	"testing"

	"github.com/onceflow/onceflow/pkg/seqguard"
)

func TestOverwrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if _, err := b.db.Pool.Exec(ctx, `CREATE SCHEMA app; CREATE TABLE app.accounts (id text PRIMARY KEY, balance bigint NOT NULL, seq bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	write := func(balance, seq int64) seqguard.Overwrite {
		return seqguard.Overwrite{
			Table: "app.accounts",
			Key:   []seqguard.Column{{Name: "id", Value: "acct-1"}},
			Set:   []seqguard.Column{{Name: "balance", Value: balance}},
		}
	}
	steps := []struct {
		name         string
		upsert       bool
		balance, seq int64
		wantWrote    bool
		wantBalance  int64
	}{
		{"update of a missing row does nothing", false, 10, 1, false, -1},
		{"upsert inserts", true, 10, 1, true, 10},
		{"newer seq overwrites", false, 30, 3, true, 30},
		{"older seq (out of order) is ignored", false, 20, 2, false, 30},
		{"replay of the same seq is ignored", true, 30, 3, false, 30},
		{"older upsert is ignored", true, 20, 2, false, 30},
		{"newer upsert overwrites", true, 40, 4, true, 40},
	}
	for _, s := range steps { // sequential: each step builds on the last
		o := write(s.balance, s.seq)
		var wrote bool
		var err error
		if s.upsert {
			wrote, err = o.Upsert(ctx, b.db.Pool, s.seq)
		} else {
			wrote, err = o.Update(ctx, b.db.Pool, s.seq)
		}
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		var bal int64 = -1
		_ = b.db.Pool.QueryRow(ctx, `SELECT balance FROM app.accounts WHERE id = 'acct-1'`).Scan(&bal)
		if wrote != s.wantWrote || bal != s.wantBalance {
			t.Errorf("%s: wrote %v balance %d, want %v %d", s.name, wrote, bal, s.wantWrote, s.wantBalance)
		}
	}
	if _, err := (seqguard.Overwrite{}).Update(ctx, b.db.Pool, 1); err == nil {
		t.Error("empty Overwrite accepted")
	}
}
