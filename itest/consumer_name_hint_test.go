package itest

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/internal/testkit"
)

// TestListsHintOtherConsumerNames: `consumer gaps list` and `dlq list` read
// the consumer name "default" unless told; on a database whose rows belong
// to another name they print the empty table and name the names that have
// rows, with the flag to pass.
func TestListsHintOtherConsumerNames(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: needs PostgreSQL")
	}
	db := testkit.NewDB(t)
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO onceflow.seq_gaps (consumer, source, from_seq, to_seq, opened_at, deadline)
		VALUES ('billing', 'acct-1', 2, 3, now(), now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `
		INSERT INTO onceflow.inbox (consumer, event_id, source, event_type, topic, kafka_partition, kafka_offset, status)
		VALUES ('billing', 'e-1', 'acct-1', 'x.y', 'orders', 0, 7, 'dead'), ('shipping', 'e-2', 's-1', 'x.y', 'orders', 0, 8, 'processed')`); err != nil {
		t.Fatal(err)
	}
	bin := testkit.Binary(t, "consumer")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"gaps", "list"}, `nothing for consumer name "default"; this database has gaps for: billing (pass -consumer-name (ONCEFLOW_CONSUMER_NAME))`},
		{[]string{"dlq", "list"}, `nothing for consumer name "default"; this database has inbox rows for: billing, shipping (pass -consumer-name (ONCEFLOW_CONSUMER_NAME))`},
	} {
		cmd := exec.Command(bin, append(c.args, "-database-url", db.URL)...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("consumer %s: %v\n%s", strings.Join(c.args, " "), err, stderr.String())
		}
		if !strings.Contains(stderr.String(), c.want) {
			t.Errorf("consumer %s: stderr %q lacks %q (stdout %q)", strings.Join(c.args, " "), stderr.String(), c.want, out)
		}
		named := exec.Command(bin, append(c.args, "-database-url", db.URL, "-consumer-name", "billing")...)
		var nerr strings.Builder
		named.Stderr = &nerr
		nout, err := named.Output()
		if err != nil || nerr.Len() != 0 || !strings.Contains(string(nout), "acct-1") {
			t.Errorf("consumer %s -consumer-name billing: %v, stderr %q, stdout %q", strings.Join(c.args, " "), err, nerr.String(), nout)
		}
	}
}
