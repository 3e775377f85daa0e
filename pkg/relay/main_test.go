package relay_test

import (
	"testing"

	"go.uber.org/goleak"
)

// The relay runs goroutines (lease renewal, stats, pruning, Kafka clients):
// none may outlive Run.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
