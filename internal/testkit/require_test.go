package testkit

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// requireScript copies scripts/require.sh into a directory every user may
// read, so that it can also be run as an unprivileged user.
func requireScript(t *testing.T) string {
	t.Helper()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "scripts", "require.sh"))
	if err != nil {
		t.Fatal(err)
	}
	dir := worldDir(t)
	path := filepath.Join(dir, "require.sh")
	if err := os.WriteFile(path, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// worldDir is a temporary directory anyone may read and enter (t.TempDir's
// parent is private to its owner).
func worldDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "onceflow-require-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// fakeAptGet writes an apt-get stand-in that logs its arguments and, on
// install, puts an executable named after each package into binDir.
func fakeAptGet(t *testing.T, binDir string) (path, logPath string) {
	t.Helper()
	dir := worldDir(t)
	if err := os.Chmod(dir, 0o777); err != nil { // the log is written by whoever runs it
		t.Fatal(err)
	}
	path = filepath.Join(dir, "apt-get")
	logPath = filepath.Join(dir, "calls.log")
	script := `#!/bin/sh
echo "$*" >>` + logPath + `
case " $* " in
*" install "*)
  for a in "$@"; do
    case "$a" in -*|install|DPkg::*) continue ;; esac
    printf '#!/bin/sh\n' >` + binDir + `/"$a"; chmod +x ` + binDir + `/"$a"
  done ;;
esac
`
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, logPath
}

func runRequire(t *testing.T, cred *syscall.Credential, env []string, args ...string) (stderr string, code int) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{requireScript(t)}, args...)...)
	cmd.Env = env
	cmd.Dir = "/"
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	var e bytes.Buffer
	cmd.Stderr = &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("run require.sh: %v", err)
	}
	return e.String(), code
}

// Not root: nothing is installed, and the one line says exactly what to run.
func TestRequireNotRootNamesTheCommand(t *testing.T) {
	t.Parallel()
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		cred = &syscall.Credential{Uid: 65534, Gid: 65534} // nobody
	}
	binDir := worldDir(t)
	apt, calls := fakeAptGet(t, binDir)
	env := []string{"PATH=" + binDir + ":/usr/bin:/bin", "ONCEFLOW_APT_GET=" + apt, "TMPDIR=" + worldDir(t)}
	stderr, code := runRequire(t, cred, env,
		"onceflow-missing-tool=onceflow-pkg-a", "/nonexistent/onceflow/*/tool=onceflow-pkg-b", "other-missing-tool=onceflow-pkg-a", "sh=dash")
	if code != 1 {
		t.Fatalf("exit %d, want 1; stderr:\n%s", code, stderr)
	}
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if len(lines) != 1 {
		t.Fatalf("want one line, got %d:\n%s", len(lines), stderr)
	}
	for _, want := range []string{
		"missing onceflow-missing-tool, /nonexistent/onceflow/*/tool, other-missing-tool;",
		apt + " update && ",
		apt + " install -y --no-install-recommends onceflow-pkg-a onceflow-pkg-b",
	} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("the line lacks %q:\n%s", want, lines[0])
		}
	}
	if strings.Contains(lines[0], "dash") {
		t.Errorf("the line names a package whose check passed (sh=dash):\n%s", lines[0])
	}
	if _, err := os.Stat(calls); err == nil {
		t.Errorf("apt-get was run although not root")
	}
}

// Root: one update and one install for everything missing, then the checks
// pass; nothing missing runs apt-get not at all.
func TestRequireRootInstallsOnce(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Log("NOT CHECKED: the root path of scripts/require.sh (installing) needs the test to run as root; " +
			"TestRequireNotRootNamesTheCommand covers the non-root path")
		return
	}
	binDir := worldDir(t)
	apt, calls := fakeAptGet(t, binDir)
	env := []string{"PATH=" + binDir + ":/usr/bin:/bin", "ONCEFLOW_APT_GET=" + apt, "TMPDIR=" + worldDir(t)}

	stderr, code := runRequire(t, nil, env, "onceflow-pkg-a=onceflow-pkg-a", "onceflow-pkg-b=onceflow-pkg-b", "sh=dash")
	if code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	log, err := os.ReadFile(calls)
	if err != nil {
		t.Fatalf("apt-get never ran: %v; stderr:\n%s", err, stderr)
	}
	got := strings.Split(strings.TrimSpace(string(log)), "\n")
	if len(got) != 2 || !strings.HasSuffix(got[0], "update -qq") ||
		!strings.HasSuffix(got[1], "install -y -qq --no-install-recommends onceflow-pkg-a onceflow-pkg-b") {
		t.Fatalf("apt-get calls:\n%s\nwant one update, then one install of onceflow-pkg-a onceflow-pkg-b", log)
	}

	// Everything present now: silent, and apt-get is not run again.
	stderr, code = runRequire(t, nil, env, "onceflow-pkg-a=onceflow-pkg-a", "onceflow-pkg-b=onceflow-pkg-b")
	if code != 0 || stderr != "" {
		t.Fatalf("second run: exit %d, stderr %q; want 0 and silence", code, stderr)
	}
	if log2, _ := os.ReadFile(calls); !bytes.Equal(log, log2) {
		t.Fatalf("apt-get ran again with nothing missing:\n%s", log2)
	}

	// A package that does not provide what was asked is an error naming both.
	stderr, code = runRequire(t, nil, env, "onceflow-tool-c=onceflow-pkg-c")
	if code != 1 || !strings.Contains(stderr, "still missing after installing onceflow-pkg-c: onceflow-tool-c (from onceflow-pkg-c)") {
		t.Fatalf("exit %d, stderr:\n%s\nwant exit 1 naming onceflow-tool-c and onceflow-pkg-c", code, stderr)
	}
}

// Every make target that runs tests, benchmarks, the demo or the image
// build asks scripts/require.sh first, for groups the script knows.
func TestMakeTargetsRequire(t *testing.T) {
	t.Parallel()
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for target, want := range map[string]string{
		"test":        "scripts/require.sh postgres kafka test",
		"bench":       "scripts/require.sh postgres kafka",
		"bench-smoke": "scripts/require.sh postgres kafka",
		"services-up": "scripts/require.sh postgres kafka",
		"demo":        "scripts/require.sh postgres",
		"image":       "scripts/require.sh image",
		"soak":        "scripts/require.sh postgres kafka",
	} {
		cmd := exec.Command("make", "-n", "--no-print-directory", target)
		cmd.Dir, cmd.Env = root, plainMakeEnv()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("make -n %s: %v\n%s", target, err, out)
			continue
		}
		first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		if target == "demo" || target == "soak" { // `go build` comes first
			first = strings.Split(strings.TrimSpace(string(out)), "\n")[1]
		}
		if strings.TrimSpace(first) != want {
			t.Errorf("make %s starts with %q, want %q", target, first, want)
		}
	}
	cmd := exec.Command("make", "-n", "--no-print-directory", "demo", "KAFKA=local")
	cmd.Dir, cmd.Env = root, plainMakeEnv()
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "scripts/require.sh postgres kafka\n") {
		t.Errorf("make demo KAFKA=local does not require kafka: %v\n%s", err, out)
	}
	// The groups the Makefile asks for exist in the script (an unknown
	// group is an error that lists the known ones).
	stderr, code := runRequire(t, nil, os.Environ(), "no-such-group")
	_, known, ok := strings.Cut(strings.TrimSpace(stderr), "(groups: ")
	if code == 0 || !ok {
		t.Fatalf("require.sh no-such-group: exit %d, %s", code, stderr)
	}
	for _, g := range []string{"postgres", "kafka", "test", "image"} {
		if !slices.Contains(strings.Fields(strings.TrimSuffix(known, ")")), g) {
			t.Errorf("require.sh has no group %q (it knows %s", g, known)
		}
	}
}

// plainMakeEnv is the environment without what a calling make passes down
// (under `make test` these tests run inside a make).
func plainMakeEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "MAKE_TERMOUT", "MAKE_TERMERR":
			continue
		}
		env = append(env, kv)
	}
	return env
}
