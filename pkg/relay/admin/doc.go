// Package admin holds the operator's commands over a relay's database (what
// `relay identity`, `relay outbox failed` and retention call): the database
// identity (ReadIdentity, AdoptIdentity, ResetIdentity), the rows the relay
// set aside (ListSetAside, GetSetAside, RetrySetAside, SkipSetAside), the
// legacy checkpoints of relays that predate identities
// (ListLegacyCheckpoints, DecideLegacyCheckpoint) and pruning by event
// class (ScanPublished, DeletePublished, PruneSetAside).
//
// It runs statements only: it links neither Kafka nor the relay engine.
package admin
