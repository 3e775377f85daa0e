package relay

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/onceflow/onceflow/pkg/relay/internal/identity"
)

// Everything the relay does about the checkpoints that relays wrote before
// databases had identities (version 1, under the bare shard name) is in this
// file, reached by one call (recoverer.recover calls settleLegacy). Once no
// database runs a relay of that version, this file and that call go.

// settleLegacy deals, once, with every checkpoint a relay wrote before
// databases had identities (under the bare shard name, which every
// database's relay shared), whatever shard layout runs now: the legacy
// relay's shard names ("default", …) need not be shards of this layout
// (from one relay to -shards N, or a renamed shard), and the rows its last
// checkpoint names may belong to any shard now. Each is settled by
// settleLegacyShard; the first that cannot be is returned.
func (r *recoverer) settleLegacy(ctx context.Context, log *slog.Logger) error {
	if r.legacySettled {
		return nil
	}
	rows, err := r.cfg.DB.Query(ctx, qLegacyPendingAll)
	if err != nil {
		return fmt.Errorf("read legacy checkpoint state: %w", err)
	}
	type pending struct {
		shard    string
		decision *string
	}
	ps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (pending, error) {
		var p pending
		err := row.Scan(&p.shard, &p.decision)
		return p, err
	})
	if err != nil {
		return fmt.Errorf("read legacy checkpoint state: %w", err)
	}
	// This relay's own shard first: its refusal is the one its operator
	// expects.
	slices.SortStableFunc(ps, func(a, b pending) int {
		return cmp.Compare(boolInt(a.shard != r.cfg.Shard), boolInt(b.shard != r.cfg.Shard))
	})
	for _, p := range ps {
		if err := r.settleLegacyShard(ctx, log, p.shard, identity.Deref(p.decision)); err != nil {
			return err
		}
	}
	r.legacySettled = true
	return nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// settleLegacyShard settles the legacy checkpoint of shard name. It first
// fences the old transactional.id (any relay of the previous version still
// running stops publishing) and then reads that checkpoint to its measured
// end:
//   - none there, or it names no row that is unpublished here: settled;
//   - an operator decided "adopt" (`relay identity legacy adopt`): its rows
//     are marked (all of them, whichever shard owns their source now), after
//     the sequence check (no fingerprints in version 1);
//   - "discard": settled; its rows are published again (duplicates that
//     consumers drop by event id, never a loss);
//   - no decision: an *IdentityError naming both commands.
//
// Relays of several shards may settle the same name at once: fencing twice
// and marking twice are harmless, and the first to record the outcome wins.
func (r *recoverer) settleLegacyShard(ctx context.Context, log *slog.Logger, name, decision string) error {
	log = log.With(slog.String("legacy_shard", name))
	legacyTxn := r.cfg.TransactionalIDPrefix + name
	if r.cfg.TransactionalIDPrefix == "" {
		legacyTxn = "onceflow-relay-" + name
	}
	// Initialising the old transactional.id fences a relay of the previous
	// version still running and ends its open transaction, so that the
	// read below sees its last checkpoint decided.
	cl, err := r.initProducer(ctx, legacyTxn)
	if err != nil {
		return fmt.Errorf("fence the previous relay version: %w", err)
	}
	cl.Close()
	settle := func(outcome string) error {
		if _, err := r.cfg.DB.Exec(ctx, qLegacySettle, name, outcome); err != nil {
			return fmt.Errorf("settle legacy checkpoint: %w", err)
		}
		log.InfoContext(ctx, "legacy checkpoint settled", slog.String("outcome", outcome))
		return nil
	}
	rec, err := lastCheckpoint(ctx, r.cfg.Hooks.checkpointReaderOpts(r.cfg.KafkaOpts), r.cfg.CheckpointTopic, name)
	if err != nil {
		return fmt.Errorf("read legacy checkpoint: %w", err)
	}
	if rec == nil {
		return settle(fmt.Sprintf("no checkpoint under the legacy key %q in %s", name, r.cfg.CheckpointTopic))
	}
	c, err := decodeCheckpoint(rec.Value)
	if err != nil || c.fps != nil {
		return &IdentityError{
			Problem: fmt.Sprintf("legacy checkpoint record %s[%d]@%d under key %q is not a version 1 checkpoint (%v)", rec.Topic, rec.Partition, rec.Offset, name, err),
			Fix:     fmt.Sprintf("run `relay identity legacy discard -shard %s` once you know what wrote it", name),
		}
	}
	var unpublished int64
	if err := r.cfg.DB.QueryRow(ctx, qUnpublishedAmong, c.ids).Scan(&unpublished); err != nil {
		return fmt.Errorf("read legacy checkpoint rows: %w", err)
	}
	desc := fmt.Sprintf("legacy checkpoint %s[%d]@%d %q", rec.Topic, rec.Partition, rec.Offset, truncate(string(rec.Value), 60))
	switch {
	case unpublished == 0 && decision == "adopt":
		// Another shard's relay, settling the same name at once, may have
		// marked them a moment ago: the adoption is what happened either way.
		return settle(desc + ": adopted; every row it names was already marked published (by another shard's relay settling it at the same time, or earlier)")
	case unpublished == 0:
		return settle(desc + ": names no row unpublished here, nothing to do")
	case decision == "discard":
		return settle(fmt.Sprintf("%s: discarded; %d rows it names are published again", desc, unpublished))
	case decision == "adopt":
		marked, err := r.applyCheckpoint(ctx, c, rec, "legacy checkpoint", nil, nil)
		if err != nil {
			return err
		}
		return settle(fmt.Sprintf("%s: adopted, %d rows marked published", desc, marked))
	}
	return &IdentityError{
		Problem: fmt.Sprintf("the relay version before database identities left %s, naming %d rows that are unpublished here; "+
			"every database's relay wrote that key, so nothing proves it is this database's", desc, unpublished),
		Fix: fmt.Sprintf("if no other database's relay ever used -checkpoint-topic %s with -shard %s, run `relay identity legacy adopt -shard %s` "+
			"(its rows are marked, nothing is published twice); otherwise run `relay identity legacy discard -shard %s` "+
			"(its rows are published again; consumers drop the duplicates by event id) (docs/relay.md, \"Upgrading\")",
			r.cfg.CheckpointTopic, name, name, name),
	}
}

const qLegacyPendingAll = `SELECT shard, decision FROM onceflow.relay_legacy_checkpoint WHERE settled_at IS NULL ORDER BY shard`

const qLegacySettle = `UPDATE onceflow.relay_legacy_checkpoint SET settled_at = now(), outcome = $2 WHERE shard = $1 AND settled_at IS NULL`

const qUnpublishedAmong = `SELECT count(*) FROM onceflow.outbox_pending WHERE id = ANY($1::bigint[])`
