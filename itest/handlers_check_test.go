package itest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testkit"
)

// TestConsumerChecksHandlerFileAtStart: a sql handler naming a table that
// does not exist stops `consumer run` at start (exit 2, the handler named)
// instead of dead-lettering every event of its type; `consumer check` says
// the same without consuming, and passes once the table exists.
func TestConsumerChecksHandlerFileAtStart(t *testing.T) {
	db := consumerDB(t)
	brokers := testkit.KafkaBrokers(t)
	topic := testkit.Topic(t, "handlers-check", 1, nil)
	file := filepath.Join(t.TempDir(), "handlers.json")
	body := `{"handlers": [{"event_type": "order.placed", "kind": "sql", "sql": "INSERT INTO public.shipments (order_id) VALUES (:payload.order_id)"}]}`
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := testkit.Binary(t, "consumer")

	out, err := exec.Command(bin, "check", "-database-url", db.URL, "-handlers-file", file).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 ||
		!strings.Contains(string(out), `refused: event_type "order.placed": relation "public.shipments" does not exist`) {
		t.Fatalf("consumer check on a missing table: %v\n%s", err, out)
	}

	p := testkit.Start(t, "consumer", bin, nil, "run", "-database-url", db.URL, "-kafka-brokers", brokers,
		"-http-addr", "127.0.0.1:0", "-topics", topic, "-group", topic, "-handlers-file", file)
	if err := p.Wait(60 * time.Second); !p.Exited() {
		t.Fatalf("consumer run still runs with a handler the database refuses: %v", err)
	}
	if code := p.Cmd.ProcessState.ExitCode(); code != 2 {
		t.Errorf("consumer run exited %d, want 2 (bad configuration)", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := p.WaitFor(ctx, regexp.MustCompile(`-handlers-file.*event_type "order.placed": relation "public.shipments" does not exist`)); err != nil {
		t.Fatalf("consumer run's error does not name the handler: %v\n%s", err, p.Output())
	}

	if _, err := db.Pool.Exec(context.Background(), `CREATE TABLE public.shipments (order_id text)`); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(bin, "check", "-database-url", db.URL, "-handlers-file", file).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "1 handlers, 1 sql statements prepared against the database: ok") {
		t.Fatalf("consumer check once the table exists: %v\n%s", err, out)
	}
}
