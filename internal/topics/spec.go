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
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/onceflow/onceflow/contract"
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

	re *regexp.Regexp
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
	if err != nil {
		return nil, fmt.Errorf("embedded contract/topics.json: %w", err)
	}
	return s, nil
}

// Load reads and validates the spec file at path.
func Load(path string) (*Spec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read topic spec: %w", err)
	}
	s, err := Parse(b)
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
		c.Topics[i] = t
	}
	return &c
}
