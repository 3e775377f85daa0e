package main

import (
	"context"
	"errors"
	"flag"
	"regexp"
	"strings"
	"testing"
)

// TestHelpNamesOnlyRealFlags: every -flag that the top-level help mentions
// under a command is a flag of that command (the help once listed -group
// as a filter of dlq list, whose flag is -error-group).
func TestHelpNamesOnlyRealFlags(t *testing.T) {
	t.Parallel()
	usageFlag := regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`)
	flagsOf := map[string]map[string]bool{}
	for _, sub := range []string{"run", "migrate", "check", "prune", "dlq list", "dlq replay", "gaps list", "gaps give-up", "gaps resolve", "reconcile",
		"effects held", "effects resolve", "effects unhold"} {
		var out strings.Builder
		err := run(context.Background(), append(strings.Fields(sub), "-h"), &out, &out)
		if !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("consumer %s -h: %v", sub, err)
		}
		flagsOf[sub] = map[string]bool{}
		for _, m := range usageFlag.FindAllStringSubmatch(out.String(), -1) {
			flagsOf[sub][m[1]] = true
		}
	}
	mentioned := regexp.MustCompile(`(?:^|[\s(/,])-([a-z][a-z0-9-]*)`)
	entry, checked := "", 0
	for _, line := range strings.Split(help, "\n") {
		if strings.HasPrefix(line, "  ") && !strings.HasPrefix(line, "   ") {
			entry = ""
			for sub := range flagsOf {
				if strings.HasPrefix(line[2:], sub+" ") || strings.TrimSpace(line[2:]) == sub {
					if len(sub) > len(entry) {
						entry = sub
					}
				}
			}
			if entry == "" {
				t.Errorf("help line %q names no command", line)
				continue
			}
		} else if !strings.HasPrefix(line, "   ") {
			entry = "" // outside the command list
		}
		if entry == "" {
			continue
		}
		for _, m := range mentioned.FindAllStringSubmatch(line, -1) {
			checked++
			if !flagsOf[entry][m[1]] {
				t.Errorf("the help names -%s under %q, which has no such flag", m[1], entry)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked only %d flags in the help", checked)
	}
}

// TestUsageShowsPositionalArguments: a command that takes positional
// arguments names them in its usage line.
func TestUsageShowsPositionalArguments(t *testing.T) {
	t.Parallel()
	for sub, want := range map[string]string{
		"dlq replay":      "usage: consumer dlq replay [EVENT-ID] [flags]",
		"gaps resolve":    "usage: consumer gaps resolve SOURCE FROM-TO [flags]",
		"effects resolve": "usage: consumer effects resolve KEY [flags]",
	} {
		var out strings.Builder
		_ = run(context.Background(), append(strings.Fields(sub), "-h"), &out, &out)
		if !strings.HasPrefix(out.String(), want+"\n") {
			t.Errorf("consumer %s -h: %q, want it to start with %q", sub, strings.SplitN(out.String(), "\n", 2)[0], want)
		}
	}
}
