// Package topics enforces onceflow's Kafka topic specs (contract/topics.json):
// it loads and validates a spec file, reports how the cluster's topics drift
// from it field by field (Verify, Check), creates what is missing and sets
// configs that drifted (Apply), and implements the `topics verify` and
// `topics apply` subcommands (Command).
package topics

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/onceflow/onceflow/contract"
	"github.com/onceflow/onceflow/pkg/wire"
)

// Role says what a topic is for; the spec rules depend on it.
type Role string

// Roles of onceflow topics.
const (
	// RoleEvents is a topic the relay publishes events to: key = source, so
	// it must never be compacted (compaction would keep only each source's
	// last event).
	RoleEvents Role = "events"
	// RoleCheckpoint is the relay's checkpoint topic: compacted, one live
	// record per relay shard.
	RoleCheckpoint Role = "checkpoint"
	// RoleDLQ receives copies of dead-lettered records.
	RoleDLQ Role = "dlq"
)

// Topic config names the typed spec fields stand for.
const (
	ConfigCleanupPolicy     = "cleanup.policy"
	ConfigCompressionType   = "compression.type"
	ConfigMinInsyncReplicas = "min.insync.replicas"
	ConfigRetentionMs       = "retention.ms"
)

// SpecFormat is the spec file format this package reads.
const SpecFormat = 1

// Spec is a parsed, validated topic spec file.
type Spec struct {
	// Format is the file format version (SpecFormat).
	Format int `json:"format"`
	// Description is free text.
	Description string `json:"description,omitempty"`
	// Topics has one entry per topic or topic-name pattern.
	Topics []TopicSpec `json:"topics"`
}

// TopicSpec is the contract of one topic, or of every existing topic whose
// name matches Pattern.
type TopicSpec struct {
	// Name is the topic name. Exactly one of Name and Pattern is set.
	Name string `json:"name,omitempty"`
	// Pattern is a regular expression (Go syntax, anchored by the author)
	// matched against existing topic names. Pattern entries are verified,
	// never created. A topic that has a Name entry is not matched against
	// patterns; otherwise the first matching pattern applies.
	Pattern string `json:"pattern,omitempty"`
	// Role is events, checkpoint or dlq.
	Role Role `json:"role"`
	// Description is free text.
	Description string `json:"description,omitempty"`
	// Partitions is the exact partition count. For keyed topics it is part
	// of the key scheme: more or fewer partitions than the spec are drift.
	Partitions int32 `json:"partitions"`
	// ReplicationFactor is the replica count of every partition.
	ReplicationFactor int16 `json:"replication_factor"`
	// MinInsyncReplicas is min.insync.replicas (1..ReplicationFactor).
	MinInsyncReplicas int `json:"min_insync_replicas"`
	// RetentionMs is retention.ms; -1 keeps records forever.
	RetentionMs int64 `json:"retention_ms"`
	// CleanupPolicy is cleanup.policy: delete, compact or compact,delete.
	CleanupPolicy string `json:"cleanup_policy"`
	// Compression is compression.type: producer, uncompressed, gzip,
	// snappy, lz4 or zstd.
	Compression string `json:"compression"`
	// Configs are further topic configs, compared as strings. They may not
	// repeat a config that has a typed field above.
	Configs map[string]string `json:"configs,omitempty"`
	// Wire is the topic's wire format (default: json with onceflow's
	// envelope headers). Only events topics have one.
	Wire *WireSpec `json:"wire,omitempty"`

	re *regexp.Regexp
}

// WireSpec is how an events topic's records are laid out (pkg/wire).
type WireSpec struct {
	// Format is json (default), avro, protobuf or json-schema. The last
	// three need a schema and a schema registry; only a named entry may
	// have one (its subject derives from the topic's name).
	Format string `json:"format,omitempty"`
	// Schema is the schema text inline; SchemaFile a file holding it,
	// relative to the spec file (for the built-in spec: to contract/).
	// Exactly one for avro, protobuf and json-schema.
	Schema     string `json:"schema,omitempty"`
	SchemaFile string `json:"schema_file,omitempty"`
	// Subject is the registry subject (default "<topic>-value").
	Subject string `json:"subject,omitempty"`
	// Message is the Protobuf message (default: the schema's first).
	Message string `json:"message,omitempty"`
	// Compatibility is the subject's compatibility level, set by apply
	// (default BACKWARD).
	Compatibility string `json:"compatibility,omitempty"`
	// CloudEvents is "" (onceflow's envelope headers), binary or
	// structured.
	CloudEvents string `json:"cloudevents,omitempty"`

	// fileText is SchemaFile's content once read.
	fileText string
}

// TopicFormat is the pkg/wire form of w (schema files read already).
func (w *WireSpec) TopicFormat() wire.TopicFormat {
	if w == nil {
		return wire.TopicFormat{Format: wire.FormatJSON}
	}
	f, _ := wire.ParseFormat(w.Format)
	schema := w.Schema
	if w.SchemaFile != "" {
		schema = w.fileText
	}
	return wire.TopicFormat{Format: f, Schema: schema, Subject: w.Subject, Message: w.Message, CloudEvents: wire.CloudEvents(w.CloudEvents)}
}

// Level is w's compatibility level.
func (w *WireSpec) Level() wire.Compatibility {
	c, _ := wire.ParseCompatibility(w.Compatibility)
	return c
}

// Registered reports whether the entry's format needs a schema registry.
func (t *TopicSpec) Registered() bool {
	return t.Wire != nil && t.Wire.TopicFormat().Format.Registered()
}

// WireFormats is the wire format of every named events topic that is not
// plain json, for pkg/wire's Encoder.
func (s *Spec) WireFormats() map[string]wire.TopicFormat {
	m := map[string]wire.TopicFormat{}
	for _, t := range s.Topics {
		if t.Name != "" && t.Wire != nil {
			m[t.Name] = t.Wire.TopicFormat()
		}
	}
	return m
}

// readSchemas loads each entry's schema_file with read (relative paths).
func (s *Spec) readSchemas(read func(name string) ([]byte, error)) error {
	for i := range s.Topics {
		w := s.Topics[i].Wire
		if w == nil || w.SchemaFile == "" {
			continue
		}
		b, err := read(w.SchemaFile)
		if err != nil {
			return fmt.Errorf("topics[%d] (%s): wire.schema_file: %w", i, s.Topics[i].Label(), err)
		}
		w.fileText = string(b)
	}
	return nil
}

func (w *WireSpec) validate(t *TopicSpec) error {
	if t.Role != RoleEvents {
		return fmt.Errorf("wire: only an events topic has a wire format, not a %s topic", t.Role)
	}
	if w.Schema != "" && w.SchemaFile != "" {
		return fmt.Errorf("wire: set schema or schema_file, not both")
	}
	if _, err := wire.ParseCompatibility(w.Compatibility); err != nil {
		return fmt.Errorf("wire: %w", err)
	}
	tf := w.TopicFormat()
	if _, err := wire.ParseFormat(w.Format); err != nil {
		return fmt.Errorf("wire: %w", err)
	}
	if tf.Format.Registered() && t.Pattern != "" {
		return fmt.Errorf("wire: format %s needs a named entry (its registry subject is the topic's), not a pattern", tf.Format)
	}
	if w.SchemaFile != "" && w.fileText == "" {
		return nil // validated once read (Load, Default)
	}
	if err := tf.Validate(); err != nil {
		return fmt.Errorf("wire: %w", err)
	}
	return nil
}

// Label names the entry in messages: its name or its pattern.
func (t *TopicSpec) Label() string {
	if t.Name != "" {
		return t.Name
	}
	return "pattern " + strconv.Quote(t.Pattern)
}

// WantConfigs is every topic config the entry fixes, by name.
func (t *TopicSpec) WantConfigs() map[string]string {
	m := make(map[string]string, len(t.Configs)+4)
	maps.Copy(m, t.Configs)
	m[ConfigCleanupPolicy] = t.CleanupPolicy
	m[ConfigCompressionType] = t.Compression
	m[ConfigMinInsyncReplicas] = strconv.Itoa(t.MinInsyncReplicas)
	m[ConfigRetentionMs] = strconv.FormatInt(t.RetentionMs, 10)
	return m
}

// Default returns the spec embedded in the binary (contract/topics.json).
func Default() (*Spec, error) {
	b, err := contract.FS.ReadFile("topics.json")
	if err != nil {
		return nil, err
	}
	s, err := Parse(b)
	if err == nil {
		err = s.readSchemas(func(name string) ([]byte, error) { return fs.ReadFile(contract.FS, path.Clean(name)) })
	}
	if err == nil {
		err = s.Validate()
	}
	if err != nil {
		return nil, fmt.Errorf("embedded contract/topics.json: %w", err)
	}
	return s, nil
}

// Load reads and validates the spec file at path, and the schema files it
// names (relative to the file's directory).
func Load(path string) (*Spec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read topic spec: %w", err)
	}
	s, err := Parse(b)
	if err == nil {
		dir := filepath.Dir(path)
		err = s.readSchemas(func(name string) ([]byte, error) {
			if !filepath.IsAbs(name) {
				name = filepath.Join(dir, name)
			}
			return os.ReadFile(name)
		})
	}
	if err == nil {
		err = s.Validate() // now with the schemas read
	}
	if err != nil {
		return nil, fmt.Errorf("topic spec %s: %w", path, err)
	}
	return s, nil
}

// Parse decodes and validates a spec. Unknown fields are errors, so a typo
// cannot silently drop a setting.
func Parse(data []byte) (*Spec, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var s Spec
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("decode: data after the spec object")
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

var (
	topicNameRE  = regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`)
	cleanupNames = map[string]bool{"delete": true, "compact": true, "compact,delete": true}
	compressions = map[string]bool{"producer": true, "uncompressed": true, "gzip": true, "snappy": true, "lz4": true, "zstd": true}
)

// Validate checks the spec; the error names the entry and the field.
func (s *Spec) Validate() error {
	if s.Format != SpecFormat {
		return fmt.Errorf("format is %d, want %d", s.Format, SpecFormat)
	}
	if len(s.Topics) == 0 {
		return fmt.Errorf("topics: none")
	}
	names := map[string]bool{}
	for i := range s.Topics {
		t := &s.Topics[i]
		if err := t.validate(); err != nil {
			return fmt.Errorf("topics[%d] (%s): %w", i, t.Label(), err)
		}
		if t.Name != "" {
			if names[t.Name] {
				return fmt.Errorf("topics[%d] (%s): name appears twice", i, t.Name)
			}
			names[t.Name] = true
		}
	}
	return nil
}

func (t *TopicSpec) validate() error {
	switch {
	case (t.Name == "") == (t.Pattern == ""):
		return fmt.Errorf("exactly one of name and pattern must be set")
	case t.Name != "" && !topicNameRE.MatchString(t.Name):
		return fmt.Errorf("name %q is not a valid Kafka topic name", t.Name)
	}
	if t.Pattern != "" {
		re, err := regexp.Compile(t.Pattern)
		if err != nil {
			return fmt.Errorf("pattern: %v", err)
		}
		t.re = re
	}
	if t.Partitions < 1 {
		return fmt.Errorf("partitions must be at least 1, got %d", t.Partitions)
	}
	if t.ReplicationFactor < 1 {
		return fmt.Errorf("replication_factor must be at least 1, got %d", t.ReplicationFactor)
	}
	if t.MinInsyncReplicas < 1 || t.MinInsyncReplicas > int(t.ReplicationFactor) {
		return fmt.Errorf("min_insync_replicas must be between 1 and replication_factor (%d), got %d", t.ReplicationFactor, t.MinInsyncReplicas)
	}
	if t.RetentionMs == 0 || t.RetentionMs < -1 {
		return fmt.Errorf("retention_ms must be positive or -1 (forever), got %d", t.RetentionMs)
	}
	policy := normalizePolicy(t.CleanupPolicy)
	if !cleanupNames[policy] {
		return fmt.Errorf("cleanup_policy %q is not delete, compact or compact,delete", t.CleanupPolicy)
	}
	t.CleanupPolicy = policy
	if !compressions[t.Compression] {
		return fmt.Errorf("compression %q is not one of producer, uncompressed, gzip, snappy, lz4, zstd", t.Compression)
	}
	for k := range t.Configs {
		switch k {
		case ConfigCleanupPolicy, ConfigCompressionType, ConfigMinInsyncReplicas, ConfigRetentionMs:
			return fmt.Errorf("configs: %s has a typed field; set that instead", k)
		case "":
			return fmt.Errorf("configs: empty config name")
		}
	}
	if t.Wire != nil {
		if err := t.Wire.validate(t); err != nil {
			return err
		}
	}
	switch t.Role {
	case RoleEvents, RoleDLQ:
		// Keyed by source: compaction would delete all but each source's
		// last event.
		if policy != "delete" {
			return fmt.Errorf("cleanup_policy of a %s topic must be delete, got %q", t.Role, policy)
		}
	case RoleCheckpoint:
		// Deleting by age would lose a shard's last checkpoint.
		if policy != "compact" {
			return fmt.Errorf("cleanup_policy of a checkpoint topic must be compact, got %q", policy)
		}
		if t.Pattern != "" {
			return fmt.Errorf("a checkpoint topic needs a name, not a pattern")
		}
	default:
		return fmt.Errorf("role %q is not events, checkpoint or dlq", t.Role)
	}
	return nil
}

// normalizePolicy sorts a comma list so "delete,compact" equals "compact,delete".
func normalizePolicy(p string) string {
	parts := strings.Split(strings.ToLower(p), ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	slices.Sort(parts)
	parts = slices.Compact(parts)
	return strings.Join(parts, ",")
}

// WithReplicationFactor returns a copy of s with every entry's replication
// factor set to rf and min.insync.replicas lowered to at most rf. It is for
// development clusters with fewer brokers than production; rf <= 0 returns
// s unchanged.
func (s *Spec) WithReplicationFactor(rf int16) *Spec {
	if rf <= 0 {
		return s
	}
	c := s.clone()
	for i := range c.Topics {
		c.Topics[i].ReplicationFactor = rf
		c.Topics[i].MinInsyncReplicas = min(c.Topics[i].MinInsyncReplicas, int(rf))
	}
	return c
}

// Select returns a copy of s holding only the entries of the given roles
// (all of them when roles is empty). The relay checks events and checkpoint
// topics; the DLQ belongs to the consumer.
func (s *Spec) Select(roles ...Role) *Spec {
	c := s.clone()
	if len(roles) == 0 {
		return c
	}
	c.Topics = slices.DeleteFunc(c.Topics, func(t TopicSpec) bool { return !slices.Contains(roles, t.Role) })
	return c
}

// Lookup returns the entry governing topic: its named entry, else the first
// pattern that matches.
func (s *Spec) Lookup(topic string) (TopicSpec, bool) {
	for _, t := range s.Topics {
		if t.Name == topic {
			return t, true
		}
	}
	for _, t := range s.Topics {
		if t.re != nil && t.re.MatchString(topic) {
			return t, true
		}
	}
	return TopicSpec{}, false
}

func (s *Spec) clone() *Spec {
	c := *s
	c.Topics = make([]TopicSpec, len(s.Topics))
	for i, t := range s.Topics {
		t.Configs = maps.Clone(t.Configs)
		if t.Wire != nil {
			w := *t.Wire
			t.Wire = &w
		}
		c.Topics[i] = t
	}
	return &c
}
