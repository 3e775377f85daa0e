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
	// RelayBeforeKafkaCommit: a relay batch and its checkpoint are produced,
	// the lease checked for the last time, the Kafka commit not asked for
	// (relay.Hooks.OnBeforeKafkaCommit). Armed with ":stop", it freezes a
	// leader that believes it still leads: the zombie a Kafka fence must stop.
	RelayBeforeKafkaCommit = "relay-before-kafka-commit"
	// RelayAfterKafkaCommit: a relay batch is committed on Kafka, not yet
	// marked in PostgreSQL (relay.Hooks.OnAfterKafkaCommit).
	RelayAfterKafkaCommit = "relay-after-kafka-commit"
	// RelaySlowCheckpoint (armed as relay-checkpoint-slow=delay:3s) makes
	// the checkpoint partition slow to answer the relay's recovery: from the
	// checkpoint reader's first Fetch request on, for that long, every Fetch
	// response reaches the reader only when the time is up
	// (relay.Hooks.CheckpointReaderOpts).
	RelaySlowCheckpoint = "relay-checkpoint-slow"
)

// Func returns a hook that calls Hit(name).
func Func(name string) func() {
	return func() { Hit(name) }
}
