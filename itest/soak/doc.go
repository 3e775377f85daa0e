// Package soak runs a two-minute chaos soak (internal/soak, `make soak`)
// in `make test`: three private brokers, a private PostgreSQL, the real
// relay and consumer binaries, and a fault schedule dense enough to kill a
// broker, restart the database, cut connections and kill processes. Being a
// package of its own keeps its JVMs and database out of the itest binary.
package soak
