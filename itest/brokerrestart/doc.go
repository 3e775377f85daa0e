// Package brokerrestart holds the relay's broker-restart fault test. It runs
// a private single-node Kafka (testkit.StartPrivateKafka) so that restarting
// the broker does not disturb the tests that share the common one; being a
// package of its own keeps its JVM out of the itest binary.
package brokerrestart
