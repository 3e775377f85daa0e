package topics

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// Kind classifies a drift.
type Kind string

// Kinds of drift.
const (
	// KindMissing: a named topic does not exist.
	KindMissing Kind = "missing"
	// KindPartitions: the partition count differs from the spec (fewer
	// breaks the key scheme's spread; more means sources were moved).
	KindPartitions Kind = "partitions"
	// KindReplicationFactor: some partition has another replica count.
	KindReplicationFactor Kind = "replication_factor"
	// KindConfig: a topic config value differs.
	KindConfig Kind = "config"
	// KindUngoverned: VerifyTopics was asked about a topic no spec entry
	// governs.
	KindUngoverned Kind = "ungoverned"
)

// Drift is one difference between a topic and its spec entry.
type Drift struct {
	// Topic is the topic's name.
	Topic string
	// Kind classifies the drift.
	Kind Kind
	// Field is what differs: "topic", "partitions", "replication_factor"
	// or a config name such as "cleanup.policy".
	Field string
	// Want is the spec's value; Got the cluster's ("" when missing).
	Want, Got string
}

func (d Drift) String() string {
	switch d.Kind {
	case KindMissing:
		return fmt.Sprintf("topic %q: missing", d.Topic)
	case KindUngoverned:
		return fmt.Sprintf("topic %q: not in the topic spec", d.Topic)
	}
	return fmt.Sprintf("topic %q: %s is %s, want %s", d.Topic, d.Field, strconv.Quote(d.Got), strconv.Quote(d.Want))
}

// Verify compares the cluster with spec and returns every drift, sorted by
// topic and field: named topics that are missing, and for each named topic
// and each existing topic matching a pattern entry, its partition count,
// replication factor and the effective value of every config the entry
// fixes (whatever its source: topic override, broker default or Kafka
// default). The error is for failing to ask, never for drift.
func Verify(ctx context.Context, adm *kadm.Client, spec *Spec) ([]Drift, error) {
	targets, err := resolve(ctx, adm, spec)
	if err != nil {
		return nil, err
	}
	return verifyTargets(ctx, adm, targets, nil)
}

// VerifyTopics checks only the named topics, each against the spec entry
// that governs it (its named entry, else the first matching pattern): for a
// relay that publishes where its outbox rows say, the topics it is about to
// use. A topic no entry governs is a drift of kind KindUngoverned.
func VerifyTopics(ctx context.Context, adm *kadm.Client, spec *Spec, names ...string) ([]Drift, error) {
	if len(names) == 0 {
		return nil, nil
	}
	var drifts []Drift
	var governed []string
	for _, n := range slices.Compact(slices.Sorted(slices.Values(names))) {
		if _, ok := spec.Lookup(n); ok {
			governed = append(governed, n)
		} else {
			drifts = append(drifts, Drift{Topic: n, Kind: KindUngoverned, Field: "spec", Want: "an entry governing the topic"})
		}
	}
	if len(governed) == 0 {
		return drifts, nil
	}
	all, err := adm.ListTopics(kadm.WithAuthorizedOps(ctx), governed...) // fresh, see resolve
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	var targets []target
	for _, n := range governed {
		ts, _ := spec.Lookup(n)
		tg, err := targetOf(n, ts, all)
		if err != nil {
			return nil, err
		}
		targets = append(targets, tg)
	}
	return verifyTargets(ctx, adm, targets, drifts)
}

// CheckTopics is VerifyTopics with drift as a *DriftError.
func CheckTopics(ctx context.Context, adm *kadm.Client, spec *Spec, names ...string) error {
	drifts, err := VerifyTopics(ctx, adm, spec, names...)
	if err != nil {
		return fmt.Errorf("verify topics: %w", err)
	}
	if len(drifts) > 0 {
		return &DriftError{Drifts: drifts}
	}
	return nil
}

func verifyTargets(ctx context.Context, adm *kadm.Client, targets []target, drifts []Drift) ([]Drift, error) {
	var present []string
	for _, tg := range targets {
		if !tg.exists {
			drifts = append(drifts, Drift{Topic: tg.name, Kind: KindMissing, Field: "topic", Want: "present"})
			continue
		}
		present = append(present, tg.name)
		drifts = append(drifts, shapeDrift(tg)...)
	}
	if len(present) > 0 {
		rcs, err := adm.DescribeTopicConfigs(ctx, present...)
		if err != nil {
			return nil, fmt.Errorf("describe topic configs: %w", err)
		}
		for _, tg := range targets {
			if !tg.exists {
				continue
			}
			rc, err := rcs.On(tg.name, nil)
			if err == nil {
				err = rc.Err
			}
			if err != nil {
				return nil, fmt.Errorf("describe configs of topic %q: %w", tg.name, err)
			}
			got := make(map[string]string, len(rc.Configs))
			for _, c := range rc.Configs {
				got[c.Key] = c.MaybeValue()
			}
			drifts = append(drifts, configDrift(tg.name, tg.spec.WantConfigs(), got)...)
		}
	}
	slices.SortStableFunc(drifts, func(a, b Drift) int {
		if a.Topic != b.Topic {
			if a.Topic < b.Topic {
				return -1
			}
			return 1
		}
		switch {
		case a.Field < b.Field:
			return -1
		case a.Field > b.Field:
			return 1
		}
		return 0
	})
	return drifts, nil
}

// Check is the start-up check: Verify, and a *DriftError (errors.Is
// ErrDrift) listing every drift when there is any.
func Check(ctx context.Context, adm *kadm.Client, spec *Spec) error {
	drifts, err := Verify(ctx, adm, spec)
	if err != nil {
		return fmt.Errorf("verify topics: %w", err)
	}
	if len(drifts) > 0 {
		return &DriftError{Drifts: drifts}
	}
	return nil
}

type target struct {
	name   string
	spec   TopicSpec
	exists bool
	detail kadm.TopicDetail
}

// resolve lists the topics the spec governs: every named entry (present or
// not) and every existing topic a pattern entry claims.
func resolve(ctx context.Context, adm *kadm.Client, spec *Spec) ([]target, error) {
	hasPattern := slices.ContainsFunc(spec.Topics, func(t TopicSpec) bool { return t.Pattern != "" })
	var names []string
	for _, t := range spec.Topics {
		if t.Name != "" {
			names = append(names, t.Name)
		}
	}
	// kadm answers metadata from the client's cache (up to 5s old) unless
	// authorized operations are asked for, which needs a fresh request: a
	// verdict on a topic created or grown a moment ago must not be stale.
	fresh := kadm.WithAuthorizedOps(ctx)
	var all kadm.TopicDetails
	var err error
	if hasPattern {
		all, err = adm.ListTopics(fresh) // every (non-internal) topic
	} else {
		all, err = adm.ListTopics(fresh, names...)
	}
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	var out []target
	for _, n := range names {
		ts, _ := spec.Lookup(n)
		tg, err := targetOf(n, ts, all)
		if err != nil {
			return nil, err
		}
		out = append(out, tg)
	}
	if hasPattern {
		for _, n := range all.Names() {
			d := all[n]
			if d.Err != nil || slices.Contains(names, n) {
				continue
			}
			if ts, ok := spec.Lookup(n); ok {
				out = append(out, target{name: n, spec: ts, exists: true, detail: d})
			}
		}
	}
	return out, nil
}

func targetOf(name string, ts TopicSpec, all kadm.TopicDetails) (target, error) {
	d, ok := all[name]
	switch {
	case !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition):
		return target{name: name, spec: ts}, nil
	case d.Err != nil:
		return target{}, fmt.Errorf("describe topic %q: %w", name, d.Err)
	}
	return target{name: name, spec: ts, exists: true, detail: d}, nil
}

func shapeDrift(tg target) []Drift {
	var out []Drift
	if got := int32(len(tg.detail.Partitions)); got != tg.spec.Partitions {
		out = append(out, Drift{Topic: tg.name, Kind: KindPartitions, Field: "partitions",
			Want: strconv.Itoa(int(tg.spec.Partitions)), Got: strconv.Itoa(int(got))})
	}
	lo, hi := -1, -1
	for _, p := range tg.detail.Partitions {
		n := len(p.Replicas)
		if lo < 0 || n < lo {
			lo = n
		}
		if n > hi {
			hi = n
		}
	}
	want := int(tg.spec.ReplicationFactor)
	if lo >= 0 && (lo != want || hi != want) {
		got := strconv.Itoa(lo)
		if lo != hi {
			got = fmt.Sprintf("%d..%d", lo, hi)
		}
		out = append(out, Drift{Topic: tg.name, Kind: KindReplicationFactor, Field: "replication_factor",
			Want: strconv.Itoa(want), Got: got})
	}
	return out
}

func configDrift(topic string, want, got map[string]string) []Drift {
	var out []Drift
	for k, w := range want {
		g, ok := got[k]
		if k == ConfigCleanupPolicy {
			g = normalizePolicy(g)
		}
		if !ok {
			g = "(not reported by the broker)"
		}
		if g != w {
			out = append(out, Drift{Topic: topic, Kind: KindConfig, Field: k, Want: w, Got: g})
		}
	}
	return out
}
