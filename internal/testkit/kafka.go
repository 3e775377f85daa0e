package testkit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Client is a plain franz-go client for the test broker, closed on cleanup.
func Client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	base := []kgo.Opt{kgo.SeedBrokers(strings.Split(KafkaBrokers(t), ",")...)}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// ReadCommittedClient consumes topics from the start with read_committed.
func ReadCommittedClient(t testing.TB, topics ...string) *kgo.Client {
	t.Helper()
	return Client(t,
		kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	)
}

// Topic creates a uniquely named topic with the given partitions and deletes
// it when the test ends. configs are topic configs (nil values allowed).
func Topic(t testing.TB, prefix string, partitions int32, configs map[string]*string) string {
	t.Helper()
	name := prefix + "-" + sanitize(t.Name(), 40) + "-" + randomHex(4)
	CreateTopic(t, name, partitions, configs)
	return name
}

// CreateTopic creates topic name and deletes it on cleanup.
func CreateTopic(t testing.TB, name string, partitions int32, configs map[string]*string) {
	t.Helper()
	adm := kadm.NewClient(Client(t))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.CreateTopic(ctx, partitions, 1, configs, name)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		adm := kadm.NewClient(Client(t))
		_, _ = adm.DeleteTopics(ctx, name)
	})
}

// StringPtr is a helper for topic configs.
func StringPtr(s string) *string { return &s }
