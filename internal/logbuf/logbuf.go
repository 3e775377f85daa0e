// Package logbuf is a log sink for tests: a buffer that a logger's
// goroutines may write while the test reads it, and a wait for a line.
package logbuf

import (
	"bytes"
	"fmt"
	"regexp"
	"sync"
	"time"
)

// Buffer is a bytes.Buffer safe for concurrent writes and reads.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Wait polls the buffer until re matches it and returns the match and its
// groups, or an error quoting the buffer once timeout has passed.
func (s *Buffer) Wait(re *regexp.Regexp, timeout time.Duration) ([]string, error) {
	for deadline := time.Now().Add(timeout); ; {
		if m := re.FindStringSubmatch(s.String()); m != nil {
			return m, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no line matching %s within %s:\n%s", re, timeout, s.String())
		}
		time.Sleep(10 * time.Millisecond) // polling a condition: the log line
	}
}
