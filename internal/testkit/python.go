package testkit

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	pythonOnce sync.Once
	pythonBin  string
	pythonErr  error
)

// Python returns the interpreter of the Python package's virtual
// environment (python/ installed with its test extras). The first call in
// a test process runs scripts/python-venv.sh, which builds the environment
// outside the work tree or reuses the one it built before.
func Python(t testing.TB) string {
	t.Helper()
	SkipIfShort(t, "the Python venv")
	pythonOnce.Do(func() {
		root, err := RepoRoot()
		if err != nil {
			pythonErr = err
			return
		}
		cmd := exec.Command(filepath.Join(root, "scripts", "python-venv.sh"))
		cmd.Dir = root
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			pythonErr = fmt.Errorf("scripts/python-venv.sh: %v\n%s", err, stderr.String())
			return
		}
		pythonBin = filepath.Join(strings.TrimSpace(string(out)), "bin", "python")
	})
	if pythonErr != nil {
		t.Fatalf("python virtual environment: %v", pythonErr)
	}
	return pythonBin
}

var (
	pythonWireOnce sync.Once
	pythonWireBin  string
	pythonWireErr  error
)

// PythonWire returns the interpreter of the small virtual environment with
// the third-party clients the wire-format tests read topics with
// (confluent-kafka with its schema-registry deserializers, the CloudEvents
// SDK), built by scripts/python-wire-venv.sh outside the work tree.
func PythonWire(t testing.TB) string {
	t.Helper()
	SkipIfShort(t, "the Python wire-format venv")
	pythonWireOnce.Do(func() {
		root, err := RepoRoot()
		if err != nil {
			pythonWireErr = err
			return
		}
		cmd := exec.Command(filepath.Join(root, "scripts", "python-wire-venv.sh"))
		cmd.Dir = root
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			pythonWireErr = fmt.Errorf("scripts/python-wire-venv.sh: %v\n%s", err, stderr.String())
			return
		}
		pythonWireBin = filepath.Join(strings.TrimSpace(string(out)), "bin", "python")
	})
	if pythonWireErr != nil {
		t.Fatalf("python wire-format virtual environment: %v", pythonWireErr)
	}
	return pythonWireBin
}
