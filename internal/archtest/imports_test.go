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
