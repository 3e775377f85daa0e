package k8s_test

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
)

// subcommands lists the subcommands a binary's `help` names: consumer's
// "commands:" table and relay's usage line.
func subcommands(t *testing.T, bin string) [][]string {
	t.Helper()
	path := testkit.Binary(t, bin) // built before the clock starts
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "help").CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("%s help: %v", bin, ctx.Err())
	}
	_ = err // help may exit 0 or 2; the output is what counts
	var subs [][]string
	seen := map[string]bool{}
	add := func(words ...string) {
		if k := strings.Join(words, " "); !seen[k] && k != "help" {
			seen[k] = true
			subs = append(subs, words)
		}
	}
	// relay: "usage: relay run [flags] | relay topics verify|apply [flags] | …"
	usage := regexp.MustCompile(bin + ` ([a-z]+)((?: [a-z|-]+)*) \[flags\]`)
	// consumer: "  dlq replay EVENT-ID     re-drive …"
	row := regexp.MustCompile(`^  ([a-z]+(?: [a-z]+)?)(?:\s{2,}| [A-Z]|$)`)
	for _, l := range strings.Split(string(out), "\n") {
		for _, m := range usage.FindAllStringSubmatch(l, -1) {
			rest := strings.Fields(m[2])
			if len(rest) == 0 {
				add(m[1])
			}
			for _, r := range rest {
				for _, alt := range strings.Split(r, "|") {
					add(m[1], alt)
				}
			}
		}
		if m := row.FindStringSubmatch(l); m != nil {
			add(strings.Fields(m[1])...)
		}
	}
	if len(subs) < 2 {
		t.Fatalf("`%s help` names %d subcommands:\n%s", bin, len(subs), out)
	}
	return subs
}

// knownTwoMeanings are names allowed to mean two things. It is empty and
// must stay so: per-invocation operator flags (-note, -to, -since, -limit,
// -all, -actor, …) read no environment variable, and every other name has
// one help text everywhere and one default per binary.
var knownTwoMeanings = map[string]bool{}

// TestEnvNamesHaveOneMeaning: an ONCEFLOW_* variable set in a shared
// environment (a ConfigMap, a shell) reaches every subcommand of both
// binaries, so each name must mean one thing everywhere: the same flag and
// the same help text, and within one binary the same default (across the
// two binaries a default may differ: -http-addr is each binary's own port).
func TestEnvNamesHaveOneMeaning(t *testing.T) {
	t.Parallel()
	type meaning struct{ bin, flag, def, usage, where string }
	seen := map[string]meaning{}
	conflicts := map[string][]string{}
	for _, bin := range []string{"relay", "consumer"} {
		for _, sub := range subcommands(t, bin) {
			fs := binaryFlags(t, bin, sub)
			for env, name := range fs.Env {
				m := meaning{bin: bin, flag: name, def: fs.Defaults[name], usage: fs.Usage[name], where: fs.Source}
				prev, ok := seen[env]
				if !ok {
					seen[env] = m
					continue
				}
				var c string
				switch {
				case prev.flag != m.flag:
					c = fmt.Sprintf("%s is -%s in `%s` but -%s in `%s`", env, prev.flag, prev.where, m.flag, m.where)
				case prev.usage != m.usage:
					c = fmt.Sprintf("%s (-%s) means %q in `%s` but %q in `%s`", env, m.flag, prev.usage, prev.where, m.usage, m.where)
				case prev.bin == m.bin && prev.def != m.def:
					c = fmt.Sprintf("%s (-%s) defaults to %q in `%s` but %q in `%s`", env, m.flag, prev.def, prev.where, m.def, m.where)
				}
				if c != "" {
					conflicts[env] = append(conflicts[env], c)
				}
			}
		}
	}
	if len(seen) < 20 {
		t.Fatalf("read only %d environment names from both binaries", len(seen))
	}
	for env, cs := range conflicts {
		for _, c := range cs {
			if knownTwoMeanings[env] {
				t.Logf("known: %s", c)
			} else {
				t.Errorf("%s", c)
			}
		}
	}
	for env := range knownTwoMeanings {
		if conflicts[env] == nil {
			t.Errorf("%s has one meaning now: remove it from knownTwoMeanings", env)
		}
	}
}
