package schema

import "errors"

var (
	// ErrNotMigrated: the database has no onceflow schema.
	ErrNotMigrated = errors.New("onceflow schema missing")
	// ErrOutdated: the database lacks migrations this build needs.
	ErrOutdated = errors.New("onceflow schema outdated")
	// ErrVersionUnreadable: the role may not read onceflow.schema_version.
	ErrVersionUnreadable = errors.New("schema version unreadable")
)
