// Package migrations embeds onceflow's numbered SQL migrations
// (NNN_name.up.sql / NNN_name.down.sql). They are applied by
// internal/migrate, which both binaries expose as their `migrate` command.
package migrations

import "embed"

// FS holds every migration file.
//
//go:embed *.sql
var FS embed.FS
