package kafkaconn

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"
)

func TestQuietLoggerDemotesRoutineTransactionLines(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		level     slog.Level
		want, not []string
	}{
		{slog.LevelInfo,
			[]string{`level=INFO msg="producer id initialization success"`, `level=WARN msg="ending transaction"`},
			[]string{"beginning transaction", `level=INFO msg="ending transaction"`}},
		{slog.LevelDebug,
			[]string{`level=DEBUG msg="beginning transaction"`, `level=DEBUG msg="ending transaction"`, `level=INFO msg="producer id initialization success"`},
			[]string{`level=INFO msg="beginning transaction"`}},
	} {
		var buf bytes.Buffer
		l := quietLogger{kslog.New(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: c.level})))}
		l.Log(kgo.LogLevelInfo, "beginning transaction", "transactional_id", "x")
		l.Log(kgo.LogLevelInfo, "ending transaction", "commit", true)
		l.Log(kgo.LogLevelInfo, "producer id initialization success", "id", 1)
		l.Log(kgo.LogLevelWarn, "ending transaction", "commit", false) // a routine message at another level keeps it
		out := buf.String()
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("at %s: output lacks %s:\n%s", c.level, w, out)
			}
		}
		for _, n := range c.not {
			if strings.Contains(out, n) {
				t.Errorf("at %s: output has %s:\n%s", c.level, n, out)
			}
		}
	}
}
