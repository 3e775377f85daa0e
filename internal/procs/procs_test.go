package procs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestKillPauseResumeStop(t *testing.T) {
	s, err := NewSet(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	spec := Spec{Bin: "/bin/sh", Args: []string{"-c", `echo started $X; trap 'echo bye; exit 0' TERM; while :; do sleep 0.05; done`}, Env: []string{"X=1"}}
	if ok, err := s.Start("a", spec); !ok || err != nil {
		t.Fatalf("start: %v %v", ok, err)
	}
	waitLog(t, s, "a", "started 1")
	if ok, _ := s.Start("a", spec); ok {
		t.Fatal("started a second copy of a running child")
	}
	pid := s.PID("a")
	if pid == 0 || !s.Running("a") {
		t.Fatal("not running")
	}
	if !s.Kill("a") || s.Running("a") {
		t.Fatal("kill")
	}
	if ok, err := s.Restart("a"); !ok || err != nil {
		t.Fatalf("restart: %v %v", ok, err)
	}
	if s.PID("a") == pid || s.Starts("a") != 2 {
		t.Fatalf("restart kept pid %d or starts %d", pid, s.Starts("a"))
	}
	if !s.Pause("a") || s.Pause("a") {
		t.Fatal("pause")
	}
	if !s.Resume("a") || s.Resume("a") {
		t.Fatal("resume")
	}
	waitLog(t, s, "a", "started 1\nstarted 1")
	s.Pause("a") // StopAll resumes paused children before SIGTERM
	if killed := s.StopAll(10 * time.Second); len(killed) != 0 {
		t.Fatalf("killed %v, want a clean exit", killed)
	}
	b, _ := os.ReadFile(filepath.Join(s.LogDir, "a.log"))
	if strings.Count(string(b), "started 1") != 2 || !strings.Contains(string(b), "bye") {
		t.Fatalf("log:\n%s", b)
	}
	if _, err := s.Restart("nobody"); err == nil {
		t.Fatal("restart of an unknown name")
	}
}

func TestStopAllKillsStragglers(t *testing.T) {
	s, err := NewSet(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"x", "y"} {
		if _, err := s.Start(n, Spec{Bin: "/bin/sh", Args: []string{"-c", `trap '' TERM; echo ready; while :; do sleep 0.05; done`}}); err != nil {
			t.Fatal(err)
		}
		waitLog(t, s, n, "ready")
	}
	killed := s.StopAll(200 * time.Millisecond)
	if len(killed) != 2 || s.Running("x") || s.Running("y") {
		t.Fatalf("killed %v", killed)
	}
}

// waitLog waits until name's log contains want (the child's trap is set).
func waitLog(t *testing.T, s *Set, name, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(filepath.Join(s.LogDir, name+".log"))
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s log lacks %q:\n%s", name, want, b)
		}
		time.Sleep(10 * time.Millisecond) // polling a file
	}
}
