// Package contract embeds onceflow's Kafka topic contract: the envelope JSON
// Schema, the topic specs and the contract version. docs/contract.md explains
// them; internal/topics enforces the topic specs.
package contract

import (
	"embed"
	"strings"
)

// FS holds VERSION, envelope.schema.json and topics.json.
//
//go:embed VERSION envelope.schema.json topics.json
var FS embed.FS

// Payloads holds the example payload schemas in payloads/ (one
// <event-type>.schema.json per type), for envelope.LoadPayloadSchemas.
//
//go:embed payloads
var Payloads embed.FS

// Version is the contract version in contract/VERSION (semantic versioning).
func Version() string {
	b, err := FS.ReadFile("VERSION")
	if err != nil {
		panic(err) // embedded: cannot happen
	}
	return strings.TrimSpace(string(b))
}
