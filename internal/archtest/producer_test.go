package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// The producer API (pkg/outbox) is what a service that only enqueues links:
// it stays small and links neither the relay's engine nor its metrics.
const (
	producerPkg         = "./pkg/outbox"
	producerMaxExported = 30
)

// producerForbidden are the packages a producer must not link: the relay's
// metrics, Kafka's admin client and error codes, and the relay's backoff.
var producerForbidden = []string{
	"github.com/prometheus/",
	"github.com/twmb/franz-go/",
	"github.com/cenkalti/backoff",
}

// TestProducerLinksNoEngine: go list -deps ./pkg/outbox holds none of
// producerForbidden.
func TestProducerLinksNoEngine(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", producerPkg)
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", producerPkg, err)
	}
	deps := strings.Fields(string(out))
	if len(deps) == 0 {
		t.Fatalf("go list -deps %s listed nothing", producerPkg)
	}
	for _, d := range deps {
		for _, p := range producerForbidden {
			if strings.HasPrefix(d, p) {
				t.Errorf("%s links %s: the producer API must not pull in the relay's engine", producerPkg, d)
			}
		}
	}
}

// exportedNames lists the exported names the non-test files of dir
// declare: constants, variables, functions, types, and the exported
// methods of exported types (as Type.Method). Struct fields are not
// counted.
func exportedNames(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s (%v)", dir, err)
	}
	var names []string
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() {
					continue
				}
				if d.Recv == nil {
					names = append(names, d.Name.Name)
					continue
				}
				if recv := recvName(d.Recv.List[0].Type); ast.IsExported(recv) {
					names = append(names, recv+"."+d.Name.Name)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.ValueSpec:
						for _, n := range s.Names {
							if n.IsExported() {
								names = append(names, n.Name)
							}
						}
					case *ast.TypeSpec:
						if !s.Name.IsExported() {
							continue
						}
						names = append(names, s.Name.Name)
					}
				}
			}
		}
	}
	sort.Strings(names)
	return names
}

func recvName(e ast.Expr) string {
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// TestProducerAPIIsSmall: pkg/outbox declares fewer than
// producerMaxExported exported names (exportedNames).
func TestProducerAPIIsSmall(t *testing.T) {
	top := exportedNames(t, filepath.Join("../..", producerPkg))
	if len(top) >= producerMaxExported {
		t.Errorf("%s exports %d names, want fewer than %d (the relay's and the operator's belong in pkg/relay): %s",
			producerPkg, len(top), producerMaxExported, strings.Join(top, ", "))
	}
	t.Logf("%s exports %d names: %s", producerPkg, len(top), strings.Join(top, ", "))
}
