package outbox

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckTopic(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"orders", "billing.events", "a_b-c.D9", strings.Repeat("x", 249), "..."} {
		if err := CheckTopic(ok); err != nil {
			t.Errorf("CheckTopic(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a b", "orders!", "héllo", "tab\tx", strings.Repeat("x", 250), "a/b"} {
		err := CheckTopic(bad)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "topic" {
			t.Errorf("CheckTopic(%q) = %v, want a FieldError for topic", bad, err)
		}
	}
}
