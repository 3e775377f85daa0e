// Package admin is the operator console of the onceflow binaries: a JSON API
// (and, in the consumer, a web page served from embedded files) for sequence
// gaps, dead letters and held events, consumer lag and relay status.
//
// It is off unless a binary is started with -admin; it then listens on its
// own address (-admin-addr, loopback by default) and answers only requests
// carrying one of the bearer tokens of -admin-token-file. Every change it
// makes (a gap resolved, dead letters replayed) is idempotent by a request
// id and recorded in onceflow.admin_audit; the operator commands of the
// consumer binary (`consumer dlq replay`, `consumer gaps resolve`) go
// through the same Service, so the CLI and the API share one implementation
// of filters, grouping, replay order and audit. See docs/console.md.
package admin
