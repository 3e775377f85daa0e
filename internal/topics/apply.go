package topics

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// Result is what Apply did and what it left.
type Result struct {
	// Created are the topics Apply created, with every config of the spec.
	Created []string
	// Altered are the config drifts Apply set to the spec's value.
	Altered []Drift
	// Remaining is the drift after Apply: partition counts and replication
	// factors, which Apply never changes (adding partitions moves sources to
	// other partitions, and replicas need a reassignment plan: both are an
	// operator's decision), and anything else that did not take.
	Remaining []Drift
}

// settle bounds how long Apply waits for the cluster to show its changes
// (metadata reaches every broker shortly after the controller commits).
const settle = 15 * time.Second

// Apply makes the cluster match spec where that is safe: it creates named
// topics that are missing (pattern entries are never created) and sets every
// topic config that drifted, one key at a time with an incremental alter, so
// configs outside the spec are left alone. It then verifies again; when drift
// remains the error is a *DriftError naming it, and Result says what was done.
func Apply(ctx context.Context, adm *kadm.Client, spec *Spec) (Result, error) {
	var res Result
	drifts, err := Verify(ctx, adm, spec)
	if err != nil {
		return res, err
	}
	alter := map[string][]kadm.AlterConfig{}
	var order []string
	for _, d := range drifts {
		switch d.Kind {
		case KindMissing:
			ts, _ := spec.Lookup(d.Topic)
			created, err := create(ctx, adm, d.Topic, ts)
			if err != nil {
				return res, err
			}
			if created {
				res.Created = append(res.Created, d.Topic)
			}
		case KindConfig:
			if _, ok := alter[d.Topic]; !ok {
				order = append(order, d.Topic)
			}
			alter[d.Topic] = append(alter[d.Topic], kadm.AlterConfig{Op: kadm.SetConfig, Name: d.Field, Value: kadm.StringPtr(d.Want)})
			res.Altered = append(res.Altered, d)
		}
	}
	for _, topic := range order {
		resps, err := adm.AlterTopicConfigs(ctx, alter[topic], topic)
		if err == nil {
			var r kadm.AlterConfigsResponse
			if r, err = resps.On(topic, nil); err == nil {
				err = r.Err
				if err != nil && r.ErrMessage != "" {
					err = fmt.Errorf("%w: %s", err, r.ErrMessage)
				}
			}
		}
		if err != nil {
			return res, fmt.Errorf("alter configs of topic %q: %w", topic, err)
		}
	}
	if len(res.Created) == 0 && len(res.Altered) == 0 {
		res.Remaining = drifts
	} else if res.Remaining, err = settled(ctx, adm, spec); err != nil {
		return res, err
	}
	if len(res.Remaining) > 0 {
		return res, &DriftError{Drifts: res.Remaining}
	}
	return res, nil
}

// create creates topic name as ts says; created is false when it already
// existed (created meanwhile by someone else, or not yet in the metadata
// Verify read: verifying again judges it).
func create(ctx context.Context, adm *kadm.Client, name string, ts TopicSpec) (created bool, err error) {
	configs := map[string]*string{}
	for k, v := range ts.WantConfigs() {
		configs[k] = kadm.StringPtr(v)
	}
	r, err := adm.CreateTopic(ctx, ts.Partitions, ts.ReplicationFactor, configs, name)
	if errors.Is(err, kerr.TopicAlreadyExists) {
		return false, nil
	}
	if err != nil {
		if r.ErrMessage != "" {
			err = fmt.Errorf("%w: %s", err, r.ErrMessage)
		}
		if errors.Is(err, kerr.InvalidReplicationFactor) {
			err = fmt.Errorf("%w (a development cluster with fewer brokers: -topics-replication-factor)", err)
		}
		return false, fmt.Errorf("create topic %q (%d partitions, replication factor %d): %w",
			name, ts.Partitions, ts.ReplicationFactor, err)
	}
	return true, nil
}

// settled verifies until the drift Apply can fix is gone (the brokers have
// caught up with the controller) or settle passes, and returns what remains.
func settled(ctx context.Context, adm *kadm.Client, spec *Spec) ([]Drift, error) {
	deadline := time.Now().Add(settle)
	wait := 20 * time.Millisecond
	for {
		drifts, err := Verify(ctx, adm, spec)
		if err != nil {
			return nil, err
		}
		fixable := false
		for _, d := range drifts {
			fixable = fixable || d.Kind == KindMissing || d.Kind == KindConfig
		}
		if !fixable || time.Now().After(deadline) {
			return drifts, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}
