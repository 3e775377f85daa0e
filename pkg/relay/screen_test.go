package relay

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// screen decides what part of a batch goes now and which row is set aside,
// without a database or Kafka: the publisher only carries the verdict out.
func TestScreenVerdicts(t *testing.T) {
	t.Parallel()
	errDown := errors.New("registry unreachable")
	refuse := func(bad string, err error) func(context.Context, string) error {
		return func(_ context.Context, topic string) error {
			if topic == bad {
				return err
			}
			return nil
		}
	}
	rw := func(id int64, topic string) row { return row{id: id, topic: topic, source: fmt.Sprint("s", id)} }
	cfg := Config{CheckpointTopic: "ckpt", BatchMaxBytes: 100}
	for _, tt := range []struct {
		name     string
		rows     []row
		check    func(context.Context, string) error
		cancel   bool
		keep     int    // rows to publish now
		setAside string // reason, "" for none
		asideID  int64
		err      bool
	}{
		{name: "all fine", rows: []row{rw(1, "a"), rw(2, "b")}, keep: 2},
		{name: "oversized alone", rows: []row{{id: 1, topic: "a", oversized: true, size: 500}, rw(2, "a")}, setAside: ReasonTooLarge, asideID: 1},
		{name: "oversized later: the batch stops before it", rows: []row{rw(1, "a"), {id: 2, topic: "a", oversized: true}}, keep: 1},
		{name: "reserved topic later", rows: []row{rw(1, "a"), rw(2, "ckpt")}, keep: 1},
		{name: "reserved topic first", rows: []row{rw(1, "ckpt"), rw(2, "a")}, setAside: ReasonInvalidTopic, asideID: 1},
		{name: "illegal topic name", rows: []row{rw(1, "a b"), rw(2, "a")}, setAside: ReasonInvalidTopic, asideID: 1},
		{name: "contract refuses the first topic", rows: []row{rw(1, "x"), rw(2, "a")},
			check: refuse("x", fmt.Errorf("%w: no schema", ErrTopicRefused)), setAside: ReasonTopicContract, asideID: 1},
		{name: "contract refuses a later topic", rows: []row{rw(1, "a"), rw(2, "x")},
			check: refuse("x", fmt.Errorf("%w: no schema", ErrTopicRefused)), keep: 1},
		{name: "check fails to run", rows: []row{rw(1, "x")}, check: refuse("x", errDown), err: true},
		{name: "check fails while stopping", rows: []row{rw(1, "x")}, check: refuse("x", errDown), cancel: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.cancel {
				cancel()
			}
			v := screen(ctx, cfg, &topicChecker{fn: tt.check}, tt.rows, map[int64]refused{})
			if len(v.rows) != tt.keep || v.setAside != tt.setAside || (tt.setAside != "" && v.row.id != tt.asideID) ||
				(tt.setAside == "" && (v.err != nil) != tt.err) {
				t.Errorf("verdict: %d rows, set aside %q (row %d), err %v; want %d rows, set aside %q (row %d), err %v",
					len(v.rows), v.setAside, v.row.id, v.err, tt.keep, tt.setAside, tt.asideID, tt.err)
			}
			if tt.setAside != "" && v.err == nil {
				t.Error("a row set aside without its cause")
			}
		})
	}
}
