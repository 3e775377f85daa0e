// Package cli holds what both binaries share on the command line: flags with
// ONCEFLOW_* environment fallbacks, and parsing that fails with one clear line
// naming the bad setting.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// EnvName is the environment variable that backs flag name:
// "kafka-brokers" -> "ONCEFLOW_KAFKA_BROKERS".
func EnvName(flagName string) string {
	return "ONCEFLOW_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Parse parses args into fs, after first applying ONCEFLOW_* environment
// variables for every flag not given on the command line (flags win), except
// for flags marked Local. Errors name the flag or the variable.
func Parse(fs *flag.FlagSet, args []string) error {
	fs.Usage = func() {} // errors are reported by the caller in one line
	fs.SetOutput(discard{})
	var bad error
	fs.VisitAll(func(f *flag.Flag) { f.Value = &named{Value: f.Value, flag: f.Name, bad: &bad} })
	err := fs.Parse(args)
	fs.VisitAll(func(f *flag.Flag) {
		if n, ok := f.Value.(*named); ok {
			f.Value = n.Value
		}
	})
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		if bad != nil {
			return bad
		}
		return fmt.Errorf("%s: %w", fs.Name(), err)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		switch f.Value.(type) {
		case *alias, *local:
			return // an alias or a per-invocation flag has no environment variable
		}
		env := EnvName(f.Name)
		v, ok := os.LookupEnv(env)
		if !ok {
			return
		}
		if err := f.Value.Set(v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %v", env, v, err))
		}
	})
	return errors.Join(errs...)
}

// Named names a flag and its environment variable for an error message:
// "-name (ONCEFLOW_NAME)".
func Named(flagName string) string { return "-" + flagName + " (" + EnvName(flagName) + ")" }

// Flag is Named for flag name of fs, or "-name" alone for a flag that reads
// no environment variable.
func Flag(fs *flag.FlagSet, name string) string {
	if f := fs.Lookup(name); f != nil {
		switch f.Value.(type) {
		case *alias, *local:
			return "-" + name
		}
	}
	return Named(name)
}

// named records the first value a command-line flag refuses, so that Parse
// names the flag and its variable the way every other error does.
type named struct {
	flag.Value
	flag string
	bad  *error
}

func (n *named) Set(s string) error {
	err := n.Value.Set(s)
	if err != nil && *n.bad == nil {
		*n.bad = fmt.Errorf("-%s: invalid value %q: %v", n.flag, s, err)
		if _, ok := n.Value.(*local); !ok {
			*n.bad = fmt.Errorf("-%s (%s): invalid value %q: %v", n.flag, EnvName(n.flag), s, err)
		}
	}
	return err
}

func (n *named) IsBoolFlag() bool {
	b, ok := n.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// Usage prints the flags of fs with their environment variables.
func Usage(fs *flag.FlagSet, w interface{ Write([]byte) (int, error) }) {
	fs.VisitAll(func(f *flag.Flag) {
		if a, ok := f.Value.(*alias); ok {
			fmt.Fprintf(w, "  -%s  (deprecated: use -%s)\n", f.Name, a.of)
			return
		}
		def := f.DefValue
		if def != "" {
			def = " (default " + strconv.Quote(def) + ")"
		}
		env := "[$" + EnvName(f.Name) + "]"
		if _, ok := f.Value.(*local); ok {
			env = "[flag only]"
		}
		fmt.Fprintf(w, "  -%s  %s%s\n      %s\n", f.Name, env, def, f.Usage)
	})
}

// Local marks the named flags of fs as per-invocation choices of an
// operator command (a note, a time range, a target version): they read no
// environment variable, so that a deployment's ONCEFLOW_* settings can never
// choose them, and Usage lists them as "[flag only]".
func Local(fs *flag.FlagSet, names ...string) {
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil {
			panic("cli.Local: no flag -" + name)
		}
		f.Value = &local{Value: f.Value}
	}
}

// local is a flag that reads no environment variable.
type local struct{ flag.Value }

func (l *local) IsBoolFlag() bool {
	b, ok := l.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// Deprecated defines flag old on fs as a deprecated spelling of flag name,
// which must be defined already: setting -old sets -name. Unlike every other
// flag, old reads no environment variable (its name may have meant
// something else elsewhere), and Usage lists it without one.
func Deprecated(fs *flag.FlagSet, old, name string) {
	f := fs.Lookup(name)
	if f == nil {
		panic("cli.Deprecated: no flag -" + name)
	}
	fs.Var(&alias{Value: f.Value, of: name}, old, "deprecated: use -"+name)
}

// alias forwards to the flag it is a deprecated spelling of.
type alias struct {
	flag.Value
	of string
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// List is a comma-separated list flag.
type List []string

func (l *List) String() string { return strings.Join(*l, ",") }

// Set replaces the list.
func (l *List) Set(s string) error {
	*l = nil
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// PositiveDuration returns an error naming flag when d <= 0.
func PositiveDuration(flagName string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%s must be positive, got %s", Named(flagName), d)
	}
	return nil
}

// UsageError is invalid usage or configuration, named in its text: a
// subcommand of either binary that returns one exits with status 2.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usagef returns a *UsageError with a formatted message.
func Usagef(format string, a ...any) error {
	return &UsageError{Err: fmt.Errorf(format, a...)}
}

// StatusError is an error that names its own exit status: a command whose
// statuses mean more than "failed" (reconcile: 1 anomalies, 2 could not
// run) returns one.
type StatusError struct {
	Status int
	Err    error
}

func (e *StatusError) Error() string { return e.Err.Error() }
func (e *StatusError) Unwrap() error { return e.Err }

// ExitCode is the one exit-status rule of every subcommand of both
// binaries: 0 for success and -help, a *StatusError's own status, 2 for a
// *UsageError, 1 for anything else.
func ExitCode(err error) int {
	var ue *UsageError
	var se *StatusError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &se):
		return se.Status
	case errors.As(err, &ue):
		return 2
	}
	return 1
}

// SchemaRegistryHelp is the help of -schema-registry-url, which means one
// thing in every command that has it (the relay encodes with it, topics
// apply/verify register and check schemas, the consumer decodes).
const SchemaRegistryHelp = "schema registry (Confluent-compatible API) of the topics whose wire format is avro, protobuf or json-schema (docs/contract.md, \"Wire formats\")"
