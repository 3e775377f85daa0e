package handlerfile_test

import (
	"strings"
	"testing"

	"github.com/onceflow/onceflow/pkg/handlerfile"
)

func TestHTTPHandlerConfig(t *testing.T) {
	good := `{"handlers":[{"event_type":"*","kind":"http","http":{"url":"http://127.0.0.1:1/x","method":"put","headers":{"Authorization":"Bearer t"},"timeout":"2s"}}]}`
	if _, err := handlerfile.Parse([]byte(good)); err != nil {
		t.Fatalf("good config: %v", err)
	}
	bad := map[string]string{
		`{"handlers":[{"event_type":"*","kind":"http"}]}`:                                                               `needs an "http" object`,
		`{"handlers":[{"event_type":"*","kind":"http","http":{"url":"/relative"}}]}`:                                    `want an absolute http or https URL`,
		`{"handlers":[{"event_type":"*","kind":"http","http":{"url":"ftp://h/x"}}]}`:                                    `want an absolute http or https URL`,
		`{"handlers":[{"event_type":"*","kind":"http","http":{"url":"http://h/x","method":"GET"}}]}`:                    `want POST, PUT, PATCH or DELETE`,
		`{"handlers":[{"event_type":"*","kind":"http","http":{"url":"http://h/x","timeout":"soon"}}]}`:                  `positive duration`,
		`{"handlers":[{"event_type":"*","kind":"http","http":{"url":"http://h/x","headers":{"idempotency-key":"x"}}}]}`: `set by the handler`,
		`{"handlers":[{"event_type":"*","kind":"http","sql":"SELECT 1","http":{"url":"http://h/x"}}]}`:                  `takes no sql`,
		`{"handlers":[{"event_type":"*","kind":"log","http":{"url":"http://h/x"}}]}`:                                    `kind log takes no http`,
	}
	for cfg, want := range bad {
		_, err := handlerfile.Parse([]byte(cfg))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want it to contain %q", cfg, err, want)
		}
	}
}
