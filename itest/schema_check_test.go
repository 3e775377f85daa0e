package itest

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
	"github.com/onceflow/onceflow/pkg/schema"
)

// TestBinariesFailFastOnUnmigratedDatabase: `relay run` and `consumer run`
// against a database nobody migrated exit at once with an error naming the
// command to run, instead of retrying "relation does not exist" forever.
func TestBinariesFailFastOnUnmigratedDatabase(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL and Kafka")
	}
	db := testkit.EmptyDB(t)
	brokers := testkit.KafkaBrokers(t)
	topic := testkit.Topic(t, "schema-check", 1, nil)
	handlers := consoleHandlersFile(t)
	want := regexp.MustCompile("onceflow schema missing: .*run `relay migrate` or `consumer migrate`")
	out, err := exec.Command(testkit.Binary(t, "relay"), "migrate", "-status", "-database-url", db.URL).CombinedOutput()
	latest, lerr := schema.Latest()
	if err != nil || lerr != nil || !strings.Contains(string(out), fmt.Sprintf("at version 0; this build's newest is %d (%d pending)", latest, latest)) {
		t.Fatalf("relay migrate -status: %v %v\n%s", err, lerr, out)
	}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"relay", []string{"run", "-database-url", db.URL, "-kafka-brokers", brokers, "-http-addr", "127.0.0.1:0",
			"-checkpoint-topic", topic + "-ckpt"}},
		{"consumer", []string{"run", "-database-url", db.URL, "-kafka-brokers", brokers, "-http-addr", "127.0.0.1:0",
			"-topics", topic, "-group", topic, "-handlers-file", handlers}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := testkit.Start(t, c.name, testkit.Binary(t, c.name), nil, c.args...)
			start := time.Now()
			if err := p.Wait(60 * time.Second); err == nil {
				t.Fatalf("%s run exited 0 on an unmigrated database", c.name)
			}
			if !p.Exited() {
				t.Fatalf("%s run still runs after 60 s on an unmigrated database", c.name)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := p.WaitFor(ctx, want); err != nil {
				t.Fatalf("%s's output does not name the command to run (%v):\n%s", c.name, err, p.Output())
			}
			t.Logf("%s exited after %s", c.name, time.Since(start).Round(time.Millisecond))
		})
	}
}
