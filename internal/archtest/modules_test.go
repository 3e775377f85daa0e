package archtest

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// Dependencies that only the repository's own tests and tools need: the
// Kubernetes manifests' tests (k8s, kustomize, the Prometheus operator's
// types) and the demo's in-process broker (kfake). They live in the modules
// deploy/k8s and cmd/demo, so that a program requiring
// github.com/onceflow/onceflow does not inherit them.
var toolOnly = []string{
	"k8s.io/",
	"sigs.k8s.io/",
	"github.com/prometheus-operator/",
	"github.com/twmb/franz-go/pkg/kfake",
}

// TestRootModuleRequiresNoToolOnlyDependency reads the root go.mod (not the
// workspace): none of its requirements, direct or indirect, is tool-only.
func TestRootModuleRequiresNoToolOnlyDependency(t *testing.T) {
	cmd := exec.Command("go", "mod", "edit", "-json", "go.mod")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod edit -json: %v", err)
	}
	var mod struct {
		Module  struct{ Path string }
		Require []struct{ Path string }
	}
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatalf("decode go.mod: %v", err)
	}
	if mod.Module.Path != module {
		t.Fatalf("root module is %q, want %q", mod.Module.Path, module)
	}
	if len(mod.Require) == 0 {
		t.Fatal("the root go.mod lists no requirement")
	}
	for _, r := range mod.Require {
		for _, p := range toolOnly {
			if strings.HasPrefix(r.Path, p) {
				t.Errorf("the root go.mod requires %s: tool-only dependencies belong in deploy/k8s or cmd/demo's go.mod", r.Path)
			}
		}
	}
}

// TestLibrariesLinkNoToolOnlyDependency: what a program importing a library
// package links (go list -deps) holds no tool-only package.
func TestLibrariesLinkNoToolOnlyDependency(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", "./pkg/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps ./pkg/...: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatal("go list -deps ./pkg/... listed nothing")
	}
	for _, d := range deps {
		for _, p := range toolOnly {
			if strings.HasPrefix(d, p) {
				t.Errorf("a library links %s", d)
			}
		}
	}
}
