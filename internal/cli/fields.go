package cli

import (
	"flag"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
)

// Fields maps the fields of a library Config to the flags that set them. It
// is a binary's one table from a library's *ConfigError to the flag and
// environment variable an operator sets, so that the library's own
// validation is the only one and still names what to change.
type Fields map[string]string

// fieldName is a Go field name inside a library's reason text.
var fieldName = regexp.MustCompile(`\b[A-Z][A-Za-z0-9]*\b`)

// Error is the *UsageError for a library's complaint about field: the flag
// and its environment variable, then reason with every other field of the
// table replaced by its flag, e.g. "-lease-renew-interval
// (ONCEFLOW_LEASE_RENEW_INTERVAL) (2s) must be at most half of -lease-ttl
// (3s)". A field that is not in the table keeps the library's own text,
// lib (e.g. "outbox config: DB is required").
func (m Fields) Error(lib, field, reason string) error {
	name, ok := m[field]
	if !ok {
		return Usagef("%s: %s %s", lib, field, reason)
	}
	reason = fieldName.ReplaceAllStringFunc(reason, func(w string) string {
		if f, ok := m[w]; ok {
			return "-" + f
		}
		return w
	})
	return Usagef("%s %s", Named(name), reason)
}

// Check reports a flag of the table that fs does not define.
func (m Fields) Check(fs *flag.FlagSet) error {
	for field, name := range m {
		if fs.Lookup(name) == nil {
			return fmt.Errorf("field %s: no flag -%s", field, name)
		}
	}
	return nil
}

// Uncovered lists the fields of the Config struct cfg that a flag could set
// (booleans, integers, durations, strings and slices of them) but that
// neither the table nor unflagged names. Slices of interfaces (client
// options) and funcs, loggers and other values are not settings.
func (m Fields) Uncovered(cfg any, unflagged ...string) []string {
	var out []string
	typ := reflect.TypeOf(cfg)
	for i := range typ.NumField() {
		f := typ.Field(i)
		switch k := f.Type.Kind(); {
		case k == reflect.Slice && f.Type.Elem().Kind() == reflect.Interface:
		case k == reflect.Bool, k == reflect.Int, k == reflect.Int32, k == reflect.Int64, k == reflect.String, k == reflect.Slice:
			if _, ok := m[f.Name]; !ok && !slices.Contains(unflagged, f.Name) {
				out = append(out, f.Name)
			}
		}
	}
	return out
}

// Var defines flag name on fs for a typed setting: parse sets *p (a
// library's ParseX function), format prints it. The default is *p as it is
// now.
func Var[T any](fs *flag.FlagSet, p *T, name, usage string, parse func(string) (T, error), format func(T) string) {
	fs.Var(&typed[T]{p: p, parse: parse, format: format}, name, usage)
}

// Int32Var defines an int32 flag.
func Int32Var(fs *flag.FlagSet, p *int32, name string, value int32, usage string) {
	*p = value
	Var(fs, p, name, usage, func(s string) (int32, error) {
		v, err := strconv.ParseInt(s, 0, 32)
		return int32(v), err
	}, func(v int32) string { return strconv.FormatInt(int64(v), 10) })
}

type typed[T any] struct {
	p      *T
	parse  func(string) (T, error)
	format func(T) string
}

func (v *typed[T]) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	return v.format(*v.p)
}

func (v *typed[T]) Set(s string) error {
	x, err := v.parse(s)
	if err != nil {
		return err
	}
	*v.p = x
	return nil
}
