package seqguard_test

import (
	"fmt"
	"time"

	"github.com/onceflow/onceflow/pkg/seqguard"
)

// Events of one source arrive as 1, 3, 4 (2 is late or lost), then 2 turns
// up in time; later 6 arrives and 5 never does.
func Example() {
	p := seqguard.Policy{GapTimeout: 30 * time.Second}.WithDefaults()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var s seqguard.State // a source never seen

	for _, seq := range []int64{1, 3, 4, 2, 6} {
		var steps []seqguard.Step
		s, steps, _ = s.Receive(seq, now, p)
		fmt.Println("receive", seq, "->", steps)
	}
	if d, ok := s.NextDeadline(); ok {
		var steps []seqguard.Step
		s, steps = s.Tick(d)
		fmt.Println("tick at the deadline ->", steps)
	}
	_, steps, _ := s.Receive(5, now.Add(time.Minute), p)
	fmt.Println("receive 5 ->", steps)
	// Output:
	// receive 1 -> [apply 1]
	// receive 3 -> [park 3 gap-opened 2-2]
	// receive 4 -> [park 4]
	// receive 2 -> [apply 2 gap-filled 2-2 apply 3 parked apply 4 parked]
	// receive 6 -> [park 6 gap-opened 5-5]
	// tick at the deadline -> [gap-given-up 5-5 (timeout) apply 6 parked]
	// receive 5 -> [apply 5 late]
}

// A handler that overwrites state guards the write with the event's seq, so
// a replayed or out-of-order older event cannot roll the row back.
func ExampleOverwrite() {
	o := seqguard.Overwrite{
		Table: "app.accounts",
		Key:   []seqguard.Column{{Name: "id", Value: "acct-1"}},
		Set:   []seqguard.Column{{Name: "balance", Value: 40}},
	}
	// In a handler: wrote, err := o.Update(ctx, tx, ev.Seq)
	fmt.Println(o.UpdateSQL())
	fmt.Println(o.UpsertSQL())
	// Output:
	// UPDATE "app"."accounts" SET "balance" = $2, "seq" = $3 WHERE "id" = $1 AND "seq" < $3
	// INSERT INTO "app"."accounts" AS t ("id", "balance", "seq") VALUES ($1, $2, $3) ON CONFLICT ("id") DO UPDATE SET "balance" = EXCLUDED."balance", "seq" = EXCLUDED."seq" WHERE t."seq" < EXCLUDED."seq"
}
