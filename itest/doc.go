// Package itest holds onceflow's integration and fault tests. They run
// against real PostgreSQL and real Apache Kafka, started by
// scripts/services.sh unless ONCEFLOW_TEST_DATABASE_URL and
// ONCEFLOW_TEST_KAFKA_BROKERS name existing servers. Each test gets its own
// database and its own topics.
package itest
