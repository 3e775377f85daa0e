package inbox

import (
	"context"
	"errors"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Applier runs the consumer's PostgreSQL side — the inbox rows, the
// sequence guard, the handler and the partition's next offset in one
// transaction; on a handler failure, one transaction per event with
// retries and then a dead letter — for records handed to it, without
// Kafka. It is what a Consumer's partition worker does with a fetched batch
// (an Effecter handler's effects made first, outside the transaction),
// and exists for tests of handlers (package inboxtest runs a handler through
// it) and for tools that feed recorded events. It runs no gap timer,
// callbacks, metrics or DLQ-topic copies; a Consumer is the way to consume
// a topic.
type Applier struct {
	app *applier
}

// ApplyResult counts what one Apply did.
type ApplyResult struct {
	// Processed events had their handler run and committed (released
	// parked events included).
	Processed int
	// Duplicates were in the inbox already: nothing was applied.
	Duplicates int
	// DeadLettered events are recorded as dead (malformed, or their
	// handler failed until the retries were exhausted, or Permanent).
	DeadLettered int
	// Parked events wait behind a gap of their source (OrderSeq).
	Parked int
}

// NewApplier checks cfg like New, except that Topics and KafkaOpts are not
// used (records name their topic), and returns an Applier. Pool, Group and
// Handler or BatchHandler are required; the retry settings, Ordering,
// ConsumerName and the guard's settings apply as in a Consumer.
func NewApplier(cfg Config) (*Applier, error) {
	cfg = cfg.WithDefaults()
	check := cfg
	check.KafkaOpts = []kgo.Opt{kgo.SeedBrokers("unused")}
	if len(check.Topics) == 0 {
		check.Topics = []string{"unused"}
	}
	if err := check.validate(); err != nil {
		return nil, err
	}
	h := cfg.BatchHandler
	if h == nil {
		h = asBatch(cfg.Handler)
	}
	app := &applier{cfg: &cfg, handler: h, eff: effecterOf(&cfg), owner: newOwner(&cfg)}
	app.guard = newGuard(app.cfg)
	app.tr = newTracing(app.cfg)
	return &Applier{app: app}, nil
}

// Apply applies recs, records of one partition in offset order, as a
// partition worker applies a fetched batch. An error is infrastructure
// trouble (the database, or ctx ending during a retry's wait): the
// transaction was rolled back and recs may be applied again.
func (a *Applier) Apply(ctx context.Context, recs ...*kgo.Record) (ApplyResult, error) {
	items := make([]item, len(recs))
	for i, r := range recs {
		items[i] = decodeItem(r, a.app.cfg.MaxPayloadBytes, "")
	}
	// An Effecter's effects first, holding no transaction, as a worker
	// makes them; ctx ending meanwhile leaves a prefix (abandoned here).
	n, err := a.app.prepare(ctx, items, ctx.Done())
	if err != nil {
		return ApplyResult{}, err
	}
	if n < len(items) {
		a.app.abandon(context.WithoutCancel(ctx), items[:n])
		return ApplyResult{}, context.Cause(ctx)
	}
	out, err := a.app.withTimeout(ctx, func(ctx context.Context) (outcome, error) { return a.app.applyTx(ctx, items) })
	var he *HandlerError
	if errors.As(err, &he) {
		out, err = a.app.applyIsolated(ctx, items, ctx.Done(), func(error) {})
	}
	if errors.Is(err, errStopped) {
		a.app.abandon(context.WithoutCancel(ctx), items) // ctx ended in a retry wait
		err = context.Cause(ctx)
	}
	if err != nil {
		return ApplyResult{}, err
	}
	return ApplyResult{Processed: out.processed, Duplicates: out.duplicates, DeadLettered: out.dead, Parked: out.guard.counts.Parked}, nil
}
