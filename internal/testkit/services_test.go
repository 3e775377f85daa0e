package testkit

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/onceflow/onceflow/internal/kafkanode"
)

// scriptEnv is the environment for a private run of scripts/services.sh: its
// own state directories and ports, and no external services named.
func scriptEnv(t *testing.T, extra ...string) []string {
	t.Helper()
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, EnvDatabaseURL+"=") || strings.HasPrefix(kv, EnvKafkaBrokers+"=") {
			continue
		}
		env = append(env, kv)
	}
	// Not t.TempDir(): its parent is private to root, and PostgreSQL runs as
	// the postgres user.
	dir, err := os.MkdirTemp("", "onceflow-svc-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return append(env, append([]string{"ONCEFLOW_RUN_DIR=" + dir}, extra...)...)
}

func runScript(t *testing.T, env []string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	root, rerr := RepoRoot()
	if rerr != nil {
		t.Fatal(rerr)
	}
	cmd := exec.Command("bash", append([]string{filepath.Join(root, "scripts", "services.sh")}, args...)...)
	cmd.Env = env
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// A missing tool is one line naming the tool and the package that provides it.
func TestServicesScriptNamesMissingTools(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, service string
		env           []string
		want          string
	}{
		{"java", "kafka", []string{"ONCEFLOW_JAVA=/nonexistent/java"}, "java not found: install the Debian package 'openjdk-17-jre-headless'"},
		{"mvn", "kafka", []string{"ONCEFLOW_MVN=/nonexistent/mvn", "ONCEFLOW_CACHE_DIR=" + t.TempDir()}, "mvn not found: install the Debian package 'maven'"},
		{"kcat", "kafka", []string{"ONCEFLOW_KCAT=/nonexistent/kcat"}, "kcat not found: install the Debian package 'kcat'"},
		{"initdb", "pg", []string{"ONCEFLOW_PG_BINDIR=/nonexistent"}, "initdb not found: install the Debian package 'postgresql'"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, stderr, err := runScript(t, scriptEnv(t, tc.env...), "up", tc.service)
			if err == nil {
				t.Fatalf("services.sh up %s succeeded without %s", tc.service, tc.name)
			}
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			if len(lines) != 1 || !strings.Contains(lines[0], tc.want) {
				t.Fatalf("stderr = %q, want one line containing %q", stderr, tc.want)
			}
		})
	}
}

// `up` twice reuses the running services; `down` leaves none of our processes.
func TestServicesScriptUpTwiceThenDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a private PostgreSQL and Kafka")
	}
	t.Parallel()
	// Ports free now, not fixed ones: two suites running side by side
	// would otherwise race for the same numbers.
	ports, err := kafkanode.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	env := scriptEnv(t, fmt.Sprintf("ONCEFLOW_PG_PORT=%d", ports[0]), fmt.Sprintf("ONCEFLOW_KAFKA_PORT=%d", ports[1]))
	runDir := strings.TrimPrefix(env[len(env)-3], "ONCEFLOW_RUN_DIR=")
	t.Cleanup(func() { _, _, _ = runScript(t, env, "down") })

	first, stderr, err := runScript(t, env, "up")
	if err != nil {
		t.Fatalf("first up: %v\n%s", err, stderr)
	}
	pgPID := readPID(t, filepath.Join(runDir, "pg", "data", "postmaster.pid"))
	kafkaPID := readPID(t, filepath.Join(runDir, "kafka", "pid"))

	second, stderr, err := runScript(t, env, "up")
	if err != nil {
		t.Fatalf("second up: %v\n%s", err, stderr)
	}
	if first != second {
		t.Fatalf("second up printed %q, first %q", second, first)
	}
	if !strings.Contains(stderr, "already running") {
		t.Fatalf("second up did not reuse the services: %s", stderr)
	}
	if got := readPID(t, filepath.Join(runDir, "kafka", "pid")); got != kafkaPID {
		t.Fatalf("kafka restarted: pid %d then %d", kafkaPID, got)
	}

	if _, stderr, err := runScript(t, env, "down"); err != nil {
		t.Fatalf("down: %v\n%s", err, stderr)
	}
	for name, pid := range map[string]int{"postgres": pgPID, "kafka": kafkaPID} {
		if syscall.Kill(pid, 0) == nil {
			t.Errorf("%s (pid %d) still running after down", name, pid)
		}
	}
}

func readPID(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	var pid int
	for _, c := range strings.SplitN(string(b), "\n", 2)[0] {
		if c < '0' || c > '9' {
			break
		}
		pid = pid*10 + int(c-'0')
	}
	if pid == 0 {
		t.Fatalf("no pid in %s", path)
	}
	return pid
}
