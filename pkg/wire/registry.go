package wire

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/sr"
)

// Compatibility is a registry compatibility level (BACKWARD, FULL, ...).
type Compatibility = sr.CompatibilityLevel

// Compatibility levels.
const (
	CompatNone               = sr.CompatNone
	CompatBackward           = sr.CompatBackward
	CompatBackwardTransitive = sr.CompatBackwardTransitive
	CompatForward            = sr.CompatForward
	CompatForwardTransitive  = sr.CompatForwardTransitive
	CompatFull               = sr.CompatFull
	CompatFullTransitive     = sr.CompatFullTransitive
)

// ParseCompatibility parses a level name (case-insensitive); "" is BACKWARD.
func ParseCompatibility(s string) (Compatibility, error) {
	if s == "" {
		return CompatBackward, nil
	}
	var c sr.CompatibilityLevel
	if err := c.UnmarshalText([]byte(strings.ToUpper(s))); err != nil {
		return 0, fmt.Errorf("compatibility %q is not NONE, BACKWARD, BACKWARD_TRANSITIVE, FORWARD, FORWARD_TRANSITIVE, FULL or FULL_TRANSITIVE", s)
	}
	return c, nil
}

// IncompatibleError is a schema change the subject's compatibility level
// refuses; nothing was registered.
type IncompatibleError struct {
	Subject  string
	Level    Compatibility
	Messages []string
}

func (e *IncompatibleError) Error() string {
	msg := fmt.Sprintf("schema change refused: not %s-compatible with subject %q's registered schemas", e.Level, e.Subject)
	if len(e.Messages) > 0 {
		msg += ": " + strings.Join(e.Messages, "; ")
	}
	return msg
}

// Register makes the registry hold tf's schema for topic: it sets the
// subject's compatibility level, checks the schema against the subject's
// latest version (an incompatible one gives *IncompatibleError and
// registers nothing) and registers it (registering the same schema again
// returns its existing id and version).
func Register(ctx context.Context, cl *sr.Client, topic string, tf TopicFormat, level Compatibility) (sr.SubjectSchema, error) {
	if err := tf.Validate(); err != nil {
		return sr.SubjectSchema{}, fmt.Errorf("topic %q: %w", topic, err)
	}
	if !tf.Format.Registered() {
		return sr.SubjectSchema{}, fmt.Errorf("topic %q is %s: nothing to register", topic, tf.Format)
	}
	subject := tf.SubjectFor(topic)
	s := sr.Schema{Schema: tf.Schema, Type: schemaType(tf.Format)}
	if ss, err := cl.LookupSchema(ctx, subject, s); err == nil {
		// Already registered: only the level may need setting.
		return ss, setCompat(ctx, cl, subject, level)
	} else if !notFound(err) {
		return sr.SubjectSchema{}, fmt.Errorf("look up subject %q: %w", subject, err)
	}
	if err := setCompat(ctx, cl, subject, level); err != nil {
		return sr.SubjectSchema{}, err
	}
	res, err := cl.CheckCompatibility(ctx, subject, -1, s)
	switch {
	case err == nil && !res.Is:
		return sr.SubjectSchema{}, &IncompatibleError{Subject: subject, Level: level, Messages: res.Messages}
	case err != nil && !notFound(err):
		return sr.SubjectSchema{}, fmt.Errorf("check compatibility of subject %q: %w", subject, err)
	}
	ss, err := cl.CreateSchema(ctx, subject, s)
	if err != nil {
		var re *sr.ResponseError
		if errors.As(err, &re) && re.StatusCode == 409 {
			return sr.SubjectSchema{}, &IncompatibleError{Subject: subject, Level: level, Messages: []string{re.Message}}
		}
		return sr.SubjectSchema{}, fmt.Errorf("register subject %q: %w", subject, err)
	}
	return ss, nil
}

func setCompat(ctx context.Context, cl *sr.Client, subject string, level Compatibility) error {
	for _, r := range cl.SetCompatibility(ctx, sr.SetCompatibility{Level: level}, subject) {
		if r.Err != nil {
			return fmt.Errorf("set compatibility of subject %q to %s: %w", subject, level, r.Err)
		}
	}
	return nil
}

// Drift is how a registered topic's subject differs from its spec.
type Drift struct {
	Subject string
	Field   string // "schema" or "compatibility"
	Want    string
	Got     string
}

// Verify reports how the registry differs from tf for topic: the schema not
// registered under the subject, or another compatibility level.
func Verify(ctx context.Context, cl *sr.Client, topic string, tf TopicFormat, level Compatibility) ([]Drift, error) {
	if !tf.Format.Registered() {
		return nil, nil
	}
	subject := tf.SubjectFor(topic)
	var out []Drift
	if _, err := cl.LookupSchema(ctx, subject, sr.Schema{Schema: tf.Schema, Type: schemaType(tf.Format)}); err != nil {
		if !notFound(err) {
			return nil, fmt.Errorf("look up subject %q: %w", subject, err)
		}
		out = append(out, Drift{Subject: subject, Field: "schema", Want: "the spec's " + string(tf.Format) + " schema", Got: "not registered"})
	}
	for _, r := range cl.Compatibility(ctx, subject) {
		switch {
		case r.Err != nil && notFound(r.Err):
			out = append(out, Drift{Subject: subject, Field: "compatibility", Want: level.String(), Got: "unset (the registry's global level)"})
		case r.Err != nil:
			return nil, fmt.Errorf("compatibility of subject %q: %w", subject, r.Err)
		case r.Level != level:
			out = append(out, Drift{Subject: subject, Field: "compatibility", Want: level.String(), Got: r.Level.String()})
		}
	}
	return out, nil
}

func notFound(err error) bool {
	var re *sr.ResponseError
	return errors.As(err, &re) && re.StatusCode == 404
}
