package failpoint

// The failpoints the binaries install as library hooks. Fault tests arm them
// by name through ONCEFLOW_FAILPOINTS.
const (
	// ConsumerAfterHandler: the handlers' writes of a batch are done, the
	// Postgres commit has not happened (inbox.Hooks.OnAfterHandler).
	ConsumerAfterHandler = "consumer-after-handler"
	// ConsumerAfterPGCommit: Postgres has committed a batch, Kafka's offset
	// not yet (inbox.Hooks.OnAfterPGCommit).
	ConsumerAfterPGCommit = "consumer-after-pg-commit"
	// EffectsAfterCall: an http handler's call has returned, its result is
	// not recorded in the effects ledger yet (handlerfile.OnAfterHTTPCall).
	EffectsAfterCall = "effects-after-call"
)

// Func returns a hook that calls Hit(name).
func Func(name string) func() {
	return func() { Hit(name) }
}
