// Package testkit is the integration-test harness: real PostgreSQL and real
// Apache Kafka (started by scripts/services.sh unless ONCEFLOW_TEST_DATABASE_URL
// / ONCEFLOW_TEST_KAFKA_BROKERS name existing ones), an isolated database per
// test, unique topics per test, and the real binaries run as subprocesses.
//
// A missing service is a test failure with the reason, never a skip.
package testkit

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Env var names understood by the harness.
const (
	EnvDatabaseURL  = "ONCEFLOW_TEST_DATABASE_URL"
	EnvKafkaBrokers = "ONCEFLOW_TEST_KAFKA_BROKERS"
	// EnvSchemaRegistryURL is the base URL of a Confluent-compatible schema
	// registry API (scripts/services.sh starts Apicurio Registry and names
	// its /apis/ccompat/v7).
	EnvSchemaRegistryURL = "ONCEFLOW_TEST_SCHEMA_REGISTRY_URL"
)

var (
	servicesOnce sync.Map // service name -> *serviceResult
)

type serviceResult struct {
	once  sync.Once
	value string
	err   error
}

// RepoRoot finds the repository root (the directory of the root module's go.mod).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		// The repository's other modules (cmd/demo, deploy/k8s) have go.mod
		// files of their own: the root is the directory of the root module.
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module github.com/onceflow/onceflow\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("the go.mod of module github.com/onceflow/onceflow was not found above the working directory")
		}
		dir = parent
	}
}

// service returns the value of envVar, starting the service with
// scripts/services.sh when the variable is unset.
func service(name, envVar string) (string, error) {
	if v := os.Getenv(envVar); v != "" {
		return v, nil
	}
	r, _ := servicesOnce.LoadOrStore(name, &serviceResult{})
	res := r.(*serviceResult)
	res.once.Do(func() {
		root, err := RepoRoot()
		if err != nil {
			res.err = err
			return
		}
		cmd := exec.Command("bash", filepath.Join(root, "scripts", "services.sh"), "up", name)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			res.err = fmt.Errorf("start %s with scripts/services.sh: %v: %s", name, err, strings.TrimSpace(stderr.String()))
			return
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), "="); ok && k == envVar {
				res.value = v
			}
		}
		if res.value == "" {
			res.err = fmt.Errorf("scripts/services.sh up %s printed no %s", name, envVar)
		}
	})
	return res.value, res.err
}

// DatabaseURL is the admin URL of the test PostgreSQL server.
func DatabaseURL(t testing.TB) string {
	t.Helper()
	SkipIfShort(t, "PostgreSQL")
	u, err := service("pg", EnvDatabaseURL)
	if err != nil {
		t.Fatalf("PostgreSQL for tests: %v", err)
	}
	return u
}

// KafkaBrokers is the comma-separated seed broker list of the test Kafka.
func KafkaBrokers(t testing.TB) string {
	t.Helper()
	SkipIfShort(t, "Apache Kafka")
	b, err := service("kafka", EnvKafkaBrokers)
	if err != nil {
		t.Fatalf("Apache Kafka for tests: %v", err)
	}
	return b
}

// SchemaRegistryURL is the base URL of the test schema registry's
// Confluent-compatible API (started by scripts/services.sh up registry
// unless ONCEFLOW_TEST_SCHEMA_REGISTRY_URL names one). A registry that cannot
// be had fails the test with the reason; -short skips it.
func SchemaRegistryURL(t testing.TB) string {
	t.Helper()
	SkipIfShort(t, "the schema registry")
	u, err := service("registry", EnvSchemaRegistryURL)
	if err != nil {
		t.Fatalf("schema registry for tests (scripts/services.sh up registry, or set %s): %v", EnvSchemaRegistryURL, err)
	}
	return u
}
