package kafkaconn

import "github.com/twmb/franz-go/pkg/kgo"

// routine are franz-go's INFO lines that every transaction writes (a relay
// batch, a consumer's transactional commit): at INFO they were about 95 % of
// a relay's log. They come at DEBUG instead; everything else franz-go says
// (producer ids, rebalances, errors) keeps its level.
var routine = map[string]bool{
	"beginning transaction":                          true,
	"ending transaction":                             true,
	"end transaction response successfully received": true,
	"flushing":                   true,
	"issuing AddOffsetsToTxn":    true,
	"beginning transact session": true,
	"transaction session ending": true,
	"transact session successful, setting to newly committed state": true,
}

// quietLogger demotes franz-go's routine per-transaction lines to DEBUG.
type quietLogger struct{ kgo.Logger }

func (l quietLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if level == kgo.LogLevelInfo && routine[msg] {
		level = kgo.LogLevelDebug
		if l.Logger.Level() < kgo.LogLevelDebug {
			return
		}
	}
	l.Logger.Log(level, msg, keyvals...)
}
