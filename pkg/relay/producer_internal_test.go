package relay

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/onceflow/onceflow/internal/testkit"
)

// The relay's producer loads metadata at most producerMetadataMinAge
// apart, not franz-go's 5 s: a produce retried after a retriable partition
// error waits for the next load, and with the default the second
// transaction after start-up (the first load is the first produce) could
// stay open for about 5 s. KafkaOpts can still set their own.
func TestProducerMetadataMinAge(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: needs Kafka")
	}
	ctx := context.Background()
	seeds := kgo.SeedBrokers(strings.Split(testkit.KafkaBrokers(t), ",")...)
	for _, tc := range []struct {
		name string
		opts []kgo.Opt
		want time.Duration
	}{
		{"default", []kgo.Opt{seeds}, producerMetadataMinAge},
		{"KafkaOpts", []kgo.Opt{seeds, kgo.MetadataMinAge(3 * time.Second)}, 3 * time.Second},
	} {
		r := &recoverer{cfg: Config{KafkaOpts: tc.opts, TransactionTimeout: 10 * time.Second, BatchMaxRows: 10}}
		cl, err := r.initProducer(ctx, fmt.Sprintf("relay-metadata-min-age-%s-%d", tc.name, time.Now().UnixNano()))
		if err != nil {
			t.Fatal(err)
		}
		got := cl.OptValue(kgo.MetadataMinAge)
		cl.Close()
		if got != tc.want {
			t.Errorf("%s: MetadataMinAge %v, want %v", tc.name, got, tc.want)
		}
	}
	if producerMetadataMinAge > time.Second {
		t.Errorf("producerMetadataMinAge %v: a retried produce would wait as long", producerMetadataMinAge)
	}
}
