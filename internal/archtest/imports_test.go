package archtest

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/onceflow/onceflow"

// goList returns, for every package matching pattern, its import path and
// its non-test imports.
func goList(t *testing.T, pattern string) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", pattern)
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v\n%s", pattern, err, stderr.String())
	}
	pkgs := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 {
			pkgs[f[0]] = f[1:]
		}
	}
	return pkgs
}

// TestLibrariesDoNotImportInternal: the libraries under pkg/ are embedded in
// other programs, so none of them may import the binaries' plumbing under
// internal/ (test hooks, configuration, connections). Test files may.
func TestLibrariesDoNotImportInternal(t *testing.T) {
	pkgs := goList(t, "./pkg/...")
	if len(pkgs) == 0 {
		t.Fatal("go list ./pkg/... listed no package")
	}
	for p, imports := range pkgs {
		for _, imp := range imports {
			if strings.HasPrefix(imp, module+"/internal/") || strings.HasPrefix(imp, module+"/cmd/") {
				t.Errorf("%s imports %s: a library must not import the binaries' plumbing", p, imp)
			}
		}
	}
}

// TestRelayPartsImportNoEngine: the relay's lease and identity
// (pkg/relay/internal/...) report what they find and call nobody back, so
// they import nothing of pkg/relay; the operator's commands
// (pkg/relay/admin) run statements only and import neither the engine nor a
// Kafka client. (Go refuses import cycles itself.)
func TestRelayPartsImportNoEngine(t *testing.T) {
	relay := module + "/pkg/relay"
	pkgs := goList(t, "./pkg/relay/...")
	for _, p := range []string{relay + "/internal/lease", relay + "/internal/identity", relay + "/admin"} {
		imports, ok := pkgs[p]
		if !ok {
			t.Errorf("go list ./pkg/relay/... did not list %s", p)
			continue
		}
		for _, imp := range imports {
			switch {
			case imp == relay,
				strings.HasPrefix(imp, relay+"/") && !strings.HasPrefix(imp, relay+"/internal/"):
				t.Errorf("%s imports %s: a part of the relay must not import the engine or its façade", p, imp)
			case strings.HasPrefix(p, relay+"/internal/lease") && strings.HasPrefix(imp, relay+"/"):
				t.Errorf("%s imports %s: the lease imports nothing of pkg/relay", p, imp)
			case strings.HasPrefix(imp, "github.com/twmb/franz-go/"):
				t.Errorf("%s imports %s: it runs statements only", p, imp)
			}
		}
	}
}
