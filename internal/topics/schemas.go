package topics

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/onceflow/onceflow/pkg/wire"
)

// KindSchema: a registered topic's schema is not in the registry under its
// subject, or the subject's compatibility level differs from the spec.
const KindSchema Kind = "schema"

// NeedsRegistry reports whether some entry of spec has a registered wire
// format (avro, protobuf, json-schema).
func (s *Spec) NeedsRegistry() bool {
	for i := range s.Topics {
		if s.Topics[i].Registered() {
			return true
		}
	}
	return false
}

// ApplySchemas registers the schema of every named entry with a registered
// wire format under its subject, after setting the subject's compatibility
// level. A schema the level refuses stops Apply with a *wire.IncompatibleError
// before anything else is changed: `topics apply` runs it before touching a
// topic, so no record is ever written under a refused schema. It returns one
// line per subject registered.
func ApplySchemas(ctx context.Context, cl *sr.Client, spec *Spec) ([]string, error) {
	var done []string
	for i := range spec.Topics {
		t := &spec.Topics[i]
		if !t.Registered() {
			continue
		}
		tf := t.Wire.TopicFormat()
		ss, err := wire.Register(ctx, cl, t.Name, tf, t.Wire.Level())
		if err != nil {
			return done, fmt.Errorf("topic %q: %w", t.Name, err)
		}
		done = append(done, fmt.Sprintf("subject %q: %s schema id %d version %d, compatibility %s",
			tf.SubjectFor(t.Name), tf.Format, ss.ID, ss.Version, t.Wire.Level()))
	}
	return done, nil
}

// VerifySchemas reports, as drifts of kind KindSchema, every registered
// entry whose schema is not registered under its subject or whose subject
// has another compatibility level.
func VerifySchemas(ctx context.Context, cl *sr.Client, spec *Spec) ([]Drift, error) {
	var out []Drift
	for i := range spec.Topics {
		t := &spec.Topics[i]
		if !t.Registered() {
			continue
		}
		ds, err := wire.Verify(ctx, cl, t.Name, t.Wire.TopicFormat(), t.Wire.Level())
		if err != nil {
			return nil, fmt.Errorf("topic %q: %w", t.Name, err)
		}
		for _, d := range ds {
			out = append(out, Drift{Topic: t.Name, Kind: KindSchema, Field: "subject " + d.Subject + " " + d.Field, Want: d.Want, Got: d.Got})
		}
	}
	return out, nil
}

// Encoder builds the pkg/wire encoder for spec's named events topics: what
// the relay lays records out with (wire.Encoder.Record where it builds a
// record from an outbox row). A spec with avro, protobuf or json-schema
// topics needs cl, and their schemas registered (topics apply), else the
// error wraps wire.ErrNotRegistered.
func Encoder(ctx context.Context, cl *sr.Client, spec *Spec) (*wire.Encoder, error) {
	if spec.NeedsRegistry() && cl == nil {
		return nil, fmt.Errorf("the topic spec has topics in avro, protobuf or json-schema: a schema registry URL is required")
	}
	return wire.NewEncoder(ctx, cl, spec.WireFormats())
}
